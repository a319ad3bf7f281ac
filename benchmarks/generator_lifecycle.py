"""One vLLM generator engine of the embedded model, alone (no service, no gRPC), timed through its
life: importing vLLM, building the engine (its EngineCore process forked from this one, Tandem's
default; `--engine-start spawn` spawns it as vLLM's CPU platform would, importing vLLM again),
a tiny-task rollout (16 prompts x 8 samples x 4 new tokens) sent to vLLM as one request per sample
and as one request of n=8 per prompt (the same seeds), and through VllmEngine.generate (which sends
one request of n per prompt), interleaved, and
closing the engine:

    PYTHONPATH=. .venv/bin/python benchmarks/generator_lifecycle.py --repeats 15

The vLLM cache is a fresh folder unless --cache DIR is given (a second run with the same DIR
shows the start with vLLM's model-info cache warm); `--vllm-exit-grace` closes with vLLM's own
5 s grace instead of Tandem's 1 s (CPU_EXIT_GRACE_S), for the close time before and after. The
__main__ guard matters: a spawned EngineCore re-imports this module.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

PROMPTS = [[1, 5 + i, 7, 9, 11] for i in range(16)]
SAMPLES, TOKENS, SEED = 8, 4, 123


async def _direct(engine, per_prompt: bool) -> None:
    """The rollout as vLLM requests: one of n samples per prompt (vLLM seeds child k with seed + k),
    or one per sample seeded alike."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    async def one(seed: int, n: int, prompt: list[int]) -> None:
        params = SamplingParams(n=n, temperature=1.0, max_tokens=TOKENS, seed=seed, logprobs=0, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        async for _ in engine._llm.generate({"prompt_token_ids": prompt}, params, f"bench-{time.monotonic_ns()}-{seed}"):
            pass

    requests = ([(SEED + i * SAMPLES, SAMPLES, p) for i, p in enumerate(PROMPTS)] if per_prompt
                else [(SEED + i * SAMPLES + j, 1, p) for i, p in enumerate(PROMPTS) for j in range(SAMPLES)])
    await asyncio.gather(*(one(*request) for request in requests))


async def _measure(settings, repeats: int, vllm_exit_grace: bool) -> None:
    import structlog

    from generator_svc.engines.vllm_engine import VllmEngine
    from tandem.generation.types import SamplingConfig

    started = time.perf_counter()
    engine = await VllmEngine.start(settings, structlog.get_logger())
    built = time.perf_counter() - started
    sampling = SamplingConfig(temperature=1.0, max_tokens=TOKENS, n=SAMPLES, seed=SEED)

    async def tandem() -> None:
        async for _ in engine.generate(PROMPTS, sampling):
            pass

    fns = {"vLLM, one request per sample": lambda: _direct(engine, per_prompt=False),
           "vLLM, one request of n per prompt": lambda: _direct(engine, per_prompt=True),
           "VllmEngine.generate": tandem}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for index in range(repeats + 3):  # 3 warm-up rounds
        for name in list(fns)[::1 if index % 2 else -1]:
            clock = time.perf_counter()
            await fns[name]()
            if index >= 3:
                times[name].append(time.perf_counter() - clock)
    if vllm_exit_grace:
        engine._exit_grace_s = None
    clock = time.perf_counter()
    await engine.close()
    closed = time.perf_counter() - clock
    print(f"engine start (core process, model, KV cache, warm-up): {built:.2f}s")
    for name, values in times.items():
        print(f"rollout, {name}: median {statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, "
              f"{len(values)} runs)")
    print(f"engine close: {closed:.2f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cache", type=Path, default=None, help="vLLM cache folder (default: a fresh one)")
    parser.add_argument("--vllm-exit-grace", action="store_true", help="close with vLLM's default grace (5 s)")
    parser.add_argument("--engine-start", choices=["fork", "spawn"], default="fork",
                        help="how vLLM starts its engine process (vllm_cfg.cpu_engine_start)")
    args = parser.parse_args()
    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model
    from generator_svc.config import GeneratorSettings, vllm_environment

    model = ensure_tiny_model(cache_root())
    scratch = Path(tempfile.mkdtemp(prefix="tandem-generator-"))
    settings = GeneratorSettings(model_name=str(model), scratch_dir=scratch, seed=0, max_model_len=64,
                                 cache_dir=args.cache or scratch / "cache", cpu_engine_start=args.engine_start)
    os.environ.update(vllm_environment(settings, {}, scratch))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    clock = time.perf_counter()
    import vllm  # noqa: F401  (timed: the service imports it the same way)

    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
    print(f"import vLLM: {time.perf_counter() - clock:.2f}s")
    asyncio.run(_measure(settings, args.repeats, args.vllm_exit_grace))


if __name__ == "__main__":
    main()
