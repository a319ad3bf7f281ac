"""Run under torchrun by the Megatron tests: builds a real backend (Megatron or DTensor) on
every rank, runs one job and writes rank 0's results as JSON.

    torchrun --nproc-per-node N -m tests.megatron.worker SETTINGS_JSON JOB OUT_JSON
SETTINGS_JSON holds one TrainerSettings, or a list of them: then each builds its backend in
turn in the one launch (closed before the next: Megatron's model-parallel state is destroyed
and made again), and OUT_JSON holds the list of their results. A list entry may name a job of
its own (`"job": "checkpoint"`, else JOB's). One launch of several layouts or jobs saves each
further one the ranks' start (importing torch and Megatron: ~8 s a rank here).
Jobs: logits (Megatron logits vs the HF model's on a fixed batch), step (GRPO train steps on
a fixed batch: logprobs, loss, grad norm per step), export (HF tensors vs the checkpoint's),
publish (streamed weight sync to a receiver process vs the HF export, peak bytes held),
moe (logits, export, steps, a load-balancing-only step and the moved tensors in one launch),
lora (DTensor + LoRA: what trains, merged export vs PEFT's own merge, checkpoint contents),
checkpoint (a save/load round trip), scatter (gloo's scatter of non-contiguous chunks; no backend).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import structlog
import torch

from trainer_svc.backends import build_backend
from trainer_svc.config import TrainerSettings
from trainer_svc.distributed import close_distributed, init_distributed
from trainer_svc.types import GrpoLossConfig, Sample


def fixed_samples(vocab_size: int, n: int = 8) -> list[Sample]:
    """Deterministic GRPO samples of varying lengths (prompt 3-5 tokens, completion 2-6)."""
    gen = torch.Generator().manual_seed(1234)
    samples = []
    for i in range(n):
        prompt, completion = 3 + i % 3, 2 + (i * 3) % 5
        ids = torch.randint(4, vocab_size, (prompt + completion,), generator=gen).tolist()
        gen_lp = (-torch.rand(completion, generator=gen) * 3).tolist()
        samples.append(Sample(ids, prompt, generation_logprobs=gen_lp, advantage=float(i % 4) - 1.5))
    return samples


def job_logits(backend, model_dir: str) -> dict:
    from transformers import AutoModelForCausalLM

    from trainer_svc.backends.megatron import cpu_compat

    samples = fixed_samples(backend.vocab_size)
    batches = backend._micro_batches(samples, len(samples), 1, backend._width(samples))
    captured = {}

    def loss_func(batch, output):
        captured["logits"] = backend._logits(output).detach()
        return output.sum() * 0.0, torch.tensor(1), {}

    with cpu_compat.active(), torch.no_grad():
        backend._model.eval()
        backend._schedule(batches, loss_func, forward_only=True)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(input_ids=batches[0].input_ids).logits.float()
    diff = (captured["logits"] - expected).abs().max().item() if "logits" in captured else None
    return {"max_abs_diff": diff, "max_abs_logit": expected.abs().max().item(), "conversion": backend.conversion}


def job_step(backend, num_steps: int) -> dict:
    samples = fixed_samples(backend.vocab_size)
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.01)
    logprobs = backend.compute_logprobs(samples, "current", 2)
    out = {"logprobs": logprobs, "steps": []}
    for _ in range(num_steps):
        result = backend.train_step(samples, loss, 8, 2, None)
        out["steps"].append(result.metrics)
    out["conversion"] = getattr(backend, "conversion", None)
    return out


def job_checkpoint(backend, directory: Path) -> dict:
    """Loss of the step after a save, then again after loading that save: equal when the
    model, optimizer, scheduler and RNG all round-trip."""
    samples = fixed_samples(backend.vocab_size)
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.01)
    backend.train_step(samples, loss, 8, 2, None)
    backend.save_checkpoint(directory)
    after_save = [backend.train_step(samples, loss, 8, 2, None).metrics for _ in range(2)]
    step = backend.load_checkpoint(directory)
    after_load = [backend.train_step(samples, loss, 8, 2, None).metrics for _ in range(2)]
    return {"restored_step": step, "after_save": after_save, "after_load": after_load}


def job_bench(backend, num_steps: int) -> dict:
    """Wall time of GRPO train steps on the fixed batch (the first one is warm-up)."""
    import time

    samples = fixed_samples(backend.vocab_size, 16)
    loss = GrpoLossConfig()
    times = []
    for _ in range(num_steps + 1):
        start = time.perf_counter()
        backend.train_step(samples, loss, 16, 4, None)
        times.append(time.perf_counter() - start)
    return {"step_s": sorted(times[1:])[len(times[1:]) // 2], "conversion": getattr(backend, "conversion", None),
            "conversion_s": getattr(backend, "conversion_s", None)}


def job_moe(backend, model_dir: str) -> dict:
    """One launch for the MoE checks, in order: logits vs HF, the export vs the checkpoint, two
    GRPO steps, a step whose only gradient is the routers' load-balancing loss (zero advantages,
    no KL: the policy loss has none), and which HF tensors the three steps moved."""
    out = {"logits": job_logits(backend, model_dir)}
    exported = job_export(backend, model_dir)
    out.update(job_step(backend, 2))
    zero = [Sample(s.token_ids, s.prompt_length, generation_logprobs=s.generation_logprobs, advantage=0.0)
            for s in fixed_samples(backend.vocab_size)]
    out["auxgrad"] = backend.train_step(zero, GrpoLossConfig(), 8, 2, None).metrics
    if settings_replay(backend):
        out["replay"] = job_replay(backend, model_dir)
    state = backend.gather_hf_state_dict()
    if state is not None:
        source = checkpoint_tensors(model_dir)
        out.update(export=exported, names=sorted(state),
                   moved=sorted(n for n in state if not torch.equal(state[n].float(), source[n].float())))
    return out


def settings_replay(backend) -> bool:
    return getattr(backend, "_replayer", None) is not None


def hf_routes(backend, model_dir: str, samples: list[Sample]) -> list[list[int]]:
    """Each sample's routes as a generator returns them, under the trainer's current weights: the
    HF model's top-k experts at every position but the last, flat [position, layer, k] (another
    implementation than Megatron's, as vLLM's is). Collective; rank 0 computes, every rank gets them."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    state = backend.gather_hf_state_dict()
    routes: list = [None]
    if state is not None:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        hf.load_state_dict(state, strict=False)
        topk, out = hf.config.num_experts_per_tok, []
        with torch.no_grad():
            for sample in samples:
                ids = torch.tensor([list(sample.token_ids)])
                logits = hf(input_ids=ids, output_router_logits=True).router_logits
                per_layer = [layer.view(ids.shape[1], -1).topk(topk, dim=-1).indices for layer in logits]
                out.append(torch.stack(per_layer, dim=1)[:-1].flatten().tolist())  # [T-1, L, k]
        routes = [out]
    dist.broadcast_object_list(routes, src=0, group=backend._env.cpu_group)
    return routes[0]


def job_replay(backend, model_dir: str) -> dict:
    """Router replay with routes fed as a generator sends them (HF's, see hf_routes): logprobs and
    GRPO steps replaying the model's own routes, and with the last MoE layer's routes of every
    other position moved to other experts (each index + 1 mod E: nothing before that layer
    changes, so exactly those rows disagree with the router's own choice). The two measuring
    steps run at learning rate 0 (the routes stay the weights' own); a last one trains. Then
    the experts the last replayed forward used against the ones fed, on every rank."""
    from dataclasses import replace

    import torch.distributed as dist

    from trainer_svc.batching import rank_shard
    from trainer_svc.routes import NOT_ROUTED, router_targets

    samples = fixed_samples(backend.vocab_size)
    routes = hf_routes(backend, model_dir, samples)
    layers, topk, experts = backend.arch.num_layers, backend.arch.moe.topk, backend.arch.moe.num_experts
    moved, moved_rows = [], 0
    for flat in routes:
        rows = torch.tensor(flat).view(-1, layers, topk)
        rows[1::2, -1] = (rows[1::2, -1] + 1) % experts
        moved_rows += rows[1::2].shape[0]
        moved.append(rows.flatten().tolist())
    own = [replace(s, routed_experts=r) for s, r in zip(samples, routes)]
    other = [replace(s, routed_experts=r) for s, r in zip(samples, moved)]
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.01)
    out = {"given_rows": sum(len(r) // (layers * topk) for r in routes) * layers, "moved_rows": moved_rows,
           "plain": backend.compute_logprobs(samples, "current", 2),
           "own": backend.compute_logprobs(own, "current", 2),
           "other": backend.compute_logprobs(other, "current", 2)}
    out["own_step"] = backend.train_step(own, loss, 8, 2, 0.0).metrics
    out["other_step"] = backend.train_step(other, loss, 8, 2, 0.0).metrics
    out["trained_step"] = backend.train_step(other, loss, 8, 2, 2e-4).metrics
    layout = backend.layout
    shard = rank_shard(other, layout.dp_rank, layout.dp_size)
    backend.compute_logprobs(other, "current", len(shard))  # one micro-batch: the last forward is the shard
    fed = router_targets(backend._micro_routes(shard, len(shard), 1, backend._width(other))[0],
                         tp_rank=layout.tp_rank, tp_size=layout.tp_size,
                         sequence_parallel=backend._config.sequence_parallel)
    used = backend._replayer.recorded_indices()
    given = [(f[:, 0] != NOT_ROUTED) for f in fed]
    mine = {"rows": int(sum(g.sum() for g in given)),
            "equal": all(torch.equal(u[g], f[g]) for u, f, g in zip(used, fed, given))}
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    out["used_by_rank"] = ranks
    return out


def job_lora(backend, model_dir: str, out_dir: Path) -> dict:
    """Three GRPO steps with LoRA; then the merged export against PEFT's merge of the exported
    adapter over the untouched base, the base weights, and what a checkpoint holds."""
    trainable = sorted(n for n, p in backend._model.named_parameters() if p.requires_grad)
    optimized = sum(len(g["params"]) for g in backend._optimizer.param_groups)
    steps = [backend.train_step(fixed_samples(backend.vocab_size), GrpoLossConfig(), 8, 2, None).metrics
             for _ in range(3)]
    merged = backend.gather_hf_state_dict()
    backend.export_adapter(out_dir / "adapter")
    backend.save_checkpoint(out_dir / "ckpt")
    logprobs = backend.compute_logprobs(fixed_samples(backend.vocab_size), "current", 4)
    if merged is None:
        return {}
    from peft import PeftModel
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    peft_merged = PeftModel.from_pretrained(base, str(out_dir / "adapter")).merge_and_unload().state_dict()
    saved = FileSystemReader(str(out_dir / "ckpt" / "dcp")).read_metadata().state_dict_metadata
    return {"trainable": trainable, "optimized": optimized, "dropout_free": backend.dropout_free, "steps": steps,
            "merged_vs_peft": max((merged[n] - peft_merged[n]).abs().max().item() for n in merged),
            "names_equal": sorted(merged) == sorted(peft_merged) == sorted(backend.hf_tensor_shapes),
            "moved": sorted(n for n in merged if not torch.equal(merged[n], base_state[n])),
            "checkpoint_model_keys": sorted(k for k in saved if k.startswith("model.")),
            "logprobs": logprobs, "merged_dir": str(out_dir / "adapter")}


def checkpoint_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint directory's safetensors files, by name."""
    from safetensors.torch import load_file

    return {name: t for f in sorted(Path(model_dir).glob("*.safetensors")) for name, t in load_file(str(f)).items()}


def job_export(backend, model_dir: str) -> dict:
    state = backend.gather_hf_state_dict()
    if state is None:
        return {}
    source = checkpoint_tensors(model_dir)
    return {"names_equal": sorted(state) == sorted(backend.hf_tensor_shapes),
            "max_abs_diff": max((state[n].float() - source[n].float()).abs().max().item() for n in state),
            "missing_from_source": sorted(set(state) - set(source))}


def _receive_versions(address: str, plans: list, out_dir: str, queue) -> None:
    """A generator's receiving side in its own process: one receive per (epoch, version, plan);
    a received version is saved to out_dir, a failed one reported (nothing staged)."""
    from tandem.weight_sync import GroupSpec, WeightReceiver

    receiver = WeightReceiver()
    for epoch, version, plan in plans:
        try:
            staged = receiver.receive(GroupSpec(address, epoch, "test", 2, op_timeout_s=60), 1, version, plan)
            torch.save(staged, Path(out_dir) / f"v{version}.pt")
            queue.put((version, "received"))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            queue.put((version, f"failed: {type(exc).__name__}: {exc}"))
    receiver.close()


def job_publish(backend, out_dir: Path) -> dict:
    """Publish through a real weight-sync group to a receiver process: streamed (v1); a plan the
    export does not match (v2: rank 0 raises, the receiver stages nothing, every rank finishes);
    streamed again (v3: the ranks are still in step). Beside it, the whole gathered state dict
    (the HF export). `held_bytes.peak` on rank 0 for the streamed and the whole-dict gather."""
    import multiprocessing as mp

    from tandem.weight_sync import GroupSpec, WeightSender, make_bucket_plan
    from trainer_svc.publish import publish_weights

    shapes = backend.hf_tensor_shapes
    bucket_bytes = 64 << 10
    plan = make_bucket_plan(((n, s, torch.float32) for n, s in shapes.items()), bucket_bytes)
    wrong = dict(shapes)
    broken = list(shapes)[len(shapes) // 2]  # mid-stream: some buckets are already out when it is found
    wrong[broken] = (shapes[broken][0] + 1, *shapes[broken][1:])
    bad_plan = make_bucket_plan(((n, s, torch.float32) for n, s in wrong.items()), bucket_bytes)
    sender, proc, queue = None, None, None
    if backend.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        sender = WeightSender()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_receive_versions,
                           args=(sender.address, [(0, 1, plan), (1, 2, bad_plan), (2, 3, plan)], str(out_dir), queue))
        proc.start()

    def publish(epoch, version, which):
        return publish_weights(backend.iter_hf_tensors(), sender, GroupSpec(sender.address if sender else "",
                               epoch, "test", 2, op_timeout_s=60), version, which)

    backend.held_bytes.reset()
    sent = publish(0, 1, plan)
    streamed_peak = backend.held_bytes.peak
    mismatch = None
    try:
        publish(1, 2, bad_plan)
    except ValueError as exc:
        mismatch = str(exc)
    publish(2, 3, plan)
    backend.held_bytes.reset()
    state = backend.gather_hf_state_dict()
    whole_peak = backend.held_bytes.peak
    if backend.rank != 0:
        return {}
    outcomes = dict(queue.get(timeout=120) for _ in range(3))
    proc.join(timeout=60)
    sender.close()
    diffs = {}
    for version in (1, 3):
        received = torch.load(out_dir / f"v{version}.pt")
        assert list(received) == list(state), (list(received)[:5], list(state)[:5])
        diffs[version] = max((received[n] - state[n].float()).abs().max().item() for n in state)
    return {"sent": sent, "total_bytes": plan.total_bytes, "num_buckets": len(plan.bucket_sizes_bytes),
            "outcomes": outcomes, "mismatch": mismatch, "broken": broken, "max_abs_diff": diffs,
            "streamed_peak": streamed_peak, "whole_peak": whole_peak,
            "largest_tensor_bytes": max(math.prod(s) for s in shapes.values()) * 4,
            "model_bytes": sum(math.prod(s) for s in shapes.values()) * 4}


def job_scatter(env) -> dict:
    """gloo scatter of non-contiguous chunks, with the CPU compatibility layer installed."""
    import torch.distributed as dist

    from trainer_svc.backends.megatron import cpu_compat

    cpu_compat.install()
    full = torch.arange(8.0).reshape(2, 4)
    chunks = list(torch.chunk(full, env.world_size, dim=1)) if env.rank == 0 else None
    out = torch.empty(2, 4 // env.world_size)
    dist.scatter(out, chunks, src=0)
    gathered = [None] * env.world_size
    dist.all_gather_object(gathered, out.tolist())
    return {"received": gathered, "expected": [c.tolist() for c in torch.chunk(full, env.world_size, dim=1)]}


def main() -> None:
    settings_path, job, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    raw = json.loads(Path(settings_path).read_text())
    if os.environ.get("RANK") == "1" and os.environ.get("TANDEM_TEST_RANK1_CACHE"):
        # a rank whose cache directory is not the one rank 0 sees (as on a machine without the shared disk)
        os.environ["TANDEM_MEGATRON_CHECKPOINT_DIR"] = os.environ["TANDEM_TEST_RANK1_CACHE"]
    env = init_distributed(600)
    results = []
    for index, one in enumerate(raw if isinstance(raw, list) else [raw]):
        one = dict(one)
        own_job = one.pop("job", job)
        if own_job == "scatter":  # no backend
            results.append(job_scatter(env))
            continue
        settings = TrainerSettings.model_validate(one)
        backend = build_backend(settings, env)
        # each layout's own files beside OUT_JSON (a publish's received versions, a checkpoint)
        out = Path(out_path)
        own = out_path if not isinstance(raw, list) else str(out.with_name(f"{out.stem}-{index}.json"))
        results.append(run_job(own_job, backend, settings, own))
        backend.close()
    if env.rank == 0:
        Path(out_path).write_text(json.dumps(results if isinstance(raw, list) else results[0]))
    structlog.get_logger().info("worker_done", rank=env.rank)
    close_distributed()


def run_job(job: str, backend, settings: TrainerSettings, out_path: str) -> dict:
    if job == "logits":
        return job_logits(backend, settings.model_name)
    if job.startswith("step"):
        return job_step(backend, int(job[4:] or 1))
    if job == "checkpoint":
        return job_checkpoint(backend, Path(out_path).with_suffix(".ckpt"))
    if job.startswith("bench"):
        return job_bench(backend, int(job[5:] or 5))
    if job == "export":
        return job_export(backend, settings.model_name)
    if job == "moe":
        return job_moe(backend, settings.model_name)
    if job == "lora":
        return job_lora(backend, settings.model_name, Path(out_path).with_suffix(".lora"))
    if job == "publish":
        return job_publish(backend, Path(out_path).with_suffix(".received"))
    raise SystemExit(f"unknown job {job}")


if __name__ == "__main__":
    main()
