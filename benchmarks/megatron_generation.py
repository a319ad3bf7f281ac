"""Generation throughput of the trainer's own Megatron model (policy.generation.backend:
megatron) against a vLLM generator, on the same prompts and sampling, in one local cluster
(the embedded tiny model; both serve the checkpoint, weight version 0):

    .venv/bin/python benchmarks/megatron_generation.py --prompts 32 --n 8 --max-tokens 16 --repeats 3

A Megatron trainer (--trainer-ranks, --tp) registers as a generator; a vLLM generator service
is started beside it. Each engine gets --repeats identical calls after one warm-up call; the
figure is generated tokens / wall seconds of a call (median), and the printed ratio is
Megatron's over vLLM's. The Megatron path has no KV cache (each token reruns the prefix), so
the gap grows with the completion length.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import structlog

from coordinator.config import load_config
from coordinator.data.tokens import Tokens
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.launcher import ServiceSpec, python_module
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import generator_settings, scratch_root
from tandem.generation.types import SamplingConfig


def _start_vllm(cfg, cluster) -> None:
    settings = generator_settings(cfg, cluster.model_dir, 0, scratch_root(cluster.run_dir) / "generator-0")
    path = cluster.run_dir / "services" / "generator-0.json"
    path.write_text(settings.model_dump_json())
    cluster.launcher.start(ServiceSpec("generator-0", python_module(
        "generator_svc", "--settings", str(path), "--host", cfg.cluster.host, "--coordinator", cluster.address)))
    cluster.registry.wait_for(lambda ms: sum(m.kind == "generator" for m in ms) >= 2, 600, check=cluster.launcher.check)


def _tokens_per_s(client, prompts, sampling, repeats: int) -> tuple[float, int]:
    """Median generated tokens/s over `repeats` calls (after a warm-up call), and tokens per call."""
    list(client.generate(prompts, sampling, timeout_s=1800))
    rates, counts = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        count = sum(len(c.token_ids) for c in client.generate(prompts, sampling, timeout_s=1800))
        rates.append(count / (time.perf_counter() - started))
        counts.append(count)
    return statistics.median(rates), int(statistics.median(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trainer-ranks", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tandem-mgen-"))
    os.environ.setdefault("TANDEM_MEGATRON_CHECKPOINT_DIR", str(root / "megatron-cache"))
    cfg = load_config(overrides=[
        "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", "policy.generation.backend=megatron",
        f"policy.megatron_cfg.tensor_model_parallel_size={args.tp}", f"cluster.trainer_ranks={args.trainer_ranks}",
        f"logger.log_dir={root}", "logger.tensorboard_enabled=false"])
    model_dir = str(ensure_tiny_model(cache_root()))
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up
    cluster = LocalCluster(cfg, model_dir, run_dir, "bench-token", structlog.get_logger())
    tokens = Tokens(model_dir)
    prompts = [tokens.prompt(f"{a}+{a * 7 % 100}=") for a in range(args.prompts)]
    sampling = SamplingConfig(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=0)
    try:
        with cluster as services:
            _start_vllm(cfg, cluster)
            by_kind = {("megatron" if g.shares_trainer_weights else "vllm"): g.client for g in services.all_generators()}
            figures = {kind: _tokens_per_s(client, prompts, sampling, args.repeats) for kind, client in by_kind.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nembedded model, {args.prompts} prompts x {args.n} samples, max_tokens {args.max_tokens}, "
          f"trainer ranks {args.trainer_ranks} (TP={args.tp}), {os.cpu_count()} cores")
    for kind, (rate, count) in figures.items():
        print(f"{kind:<9} {rate:9.1f} tokens/s  ({count} tokens per call, median of {args.repeats})")
    print(f"megatron / vllm: {figures['megatron'][0] / figures['vllm'][0]:.3f}")


if __name__ == "__main__":
    main()
