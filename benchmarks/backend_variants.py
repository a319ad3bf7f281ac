"""Train the same batches under several DTensor backend settings in one torchrun world and
report, per variant, the losses, grad norms, logprobs and step times (rank 0 writes JSON).

    torchrun --standalone --nproc-per-node 2 benchmarks/backend_variants.py SPEC.json OUT.json

SPEC: {"model_dir": ..., "base": {TrainerSettings fields}, "variants": {name: {fields}},
       "num_samples": 16, "min_length": 8, "max_length": 48, "seed": 0,
       "global_batch_size": 8, "micro_batch_size": 4, "num_steps": 3, "loss": {"kind": "nll"}
       | {"kind": "grpo", ...GrpoLossConfig fields}, "checkpoint_dir": optional shared directory}
Every variant starts from the checkpoint and sees the same samples; the tests compare the
variants' numbers (tests/integration/test_dtensor_options.py) and benchmarks/dtensor_options.py
prints their step times. A SPEC of the form {"jobs": {job: SPEC}} runs each job in turn in the
same world (one launch for several comparisons) and OUT holds {job: results}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainer_svc.backends.dtensor import DTensorBackend
from trainer_svc.config import TrainerSettings
from trainer_svc.distributed import close_distributed, init_distributed
from trainer_svc.types import GrpoLossConfig, LossConfig, NllLossConfig, Sample


def make_samples(spec: dict[str, Any], vocab_size: int) -> list[Sample]:
    """Random prompts + completions of varied lengths, with advantages and generation logprobs."""
    gen = torch.Generator().manual_seed(spec.get("seed", 0))
    samples = []
    for _ in range(spec.get("num_samples", 16)):
        n = int(torch.randint(spec.get("min_length", 8), spec.get("max_length", 48) + 1, (), generator=gen))
        prompt = int(torch.randint(1, max(2, n // 2), (), generator=gen))
        ids = tuple(torch.randint(3, vocab_size, (n,), generator=gen).tolist())
        logprobs = tuple((-3.5 - torch.rand(n - prompt, generator=gen)).tolist())
        samples.append(Sample(ids, prompt, generation_logprobs=logprobs,
                              advantage=float(torch.randn((), generator=gen))))
    return samples


def build_loss(spec: dict[str, Any]) -> LossConfig:
    fields = dict(spec)
    kind = fields.pop("kind")
    return NllLossConfig() if kind == "nll" else GrpoLossConfig(**fields)


def resume_losses(backend: DTensorBackend, path: Path, step) -> list[float]:
    """Save a DCP checkpoint, take a step, restore, take the step again: both losses must agree."""
    backend.save_checkpoint(path)
    first = step()
    backend.load_checkpoint(path)
    return [first, step()]


def run_variant(settings: TrainerSettings, env, samples: list[Sample], spec: dict[str, Any],
                checkpoint: Path | None = None) -> dict[str, Any]:
    backend = DTensorBackend(settings, env)
    # what the variant really sharded, e.g. "dp,tp:Shard(dim=0),Shard(dim=1)"
    layout = sorted({",".join(map(str, p.device_mesh.mesh_dim_names)) + ":" + ",".join(map(repr, p.placements))
                     for p in backend._model.parameters()})
    param_dtypes = sorted({str(p.dtype) for p in backend._model.parameters()})  # the master weights
    loss = build_loss(spec.get("loss", {"kind": "nll"}))
    gbs, mbs = spec.get("global_batch_size", 8), spec.get("micro_batch_size", 4)
    logprobs = backend.compute_logprobs(samples, "current", mbs)
    losses, norms, times = [], [], []
    for _ in range(spec.get("num_steps", 3)):
        start = time.perf_counter()
        result = backend.train_step(samples, loss, gbs, mbs, None)
        times.append(time.perf_counter() - start)
        losses.append(result.metrics["loss"])
        norms.append(result.metrics["grad_norm"])
    after = backend.compute_logprobs(samples, "current", mbs)
    resumed = resume_losses(backend, checkpoint, lambda: backend.train_step(samples, loss, gbs, mbs, None)
                            .metrics["loss"]) if checkpoint else []
    state = backend.gather_hf_state_dict()  # collective; full HF tensors on rank 0
    state_sums = {name: float(t.double().sum()) for name, t in state.items()} if state is not None else {}
    backend.close()
    return {"logprobs": logprobs, "logprobs_after": after, "losses": losses, "grad_norms": norms,
            "step_times_s": times, "layout": layout, "param_dtypes": param_dtypes,
            "state_sums": state_sums, "resume_losses": resumed}


def run_job(spec: dict[str, Any], env) -> dict[str, Any]:
    """Every variant of one SPEC: {variant: results}."""
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(spec["model_dir"]).vocab_size
    samples = make_samples(spec, vocab_size)
    results = {}
    for name, variant in spec["variants"].items():
        settings = TrainerSettings.model_validate({"model_name": spec["model_dir"], **spec.get("base", {}), **variant})
        checkpoint = Path(spec["checkpoint_dir"]) / name.replace(" ", "_") if spec.get("checkpoint_dir") else None
        results[name] = run_variant(settings, env, samples, spec, checkpoint)
    return results


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    env = init_distributed(600)
    results = ({job: run_job(job_spec, env) for job, job_spec in spec["jobs"].items()} if "jobs" in spec
               else run_job(spec, env))
    if env.rank == 0:
        Path(out_path).write_text(json.dumps(results))
    close_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:3])
