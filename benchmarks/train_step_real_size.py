"""The trainer's GRPO train step at a real model's size, in-process (no services), per phase.

    PYTHONPATH=. .venv/bin/python benchmarks/train_step_real_size.py --reps 2

One DTensorBackend on one gloo rank (as the trainer service runs it) loads a random-init
checkpoint with Qwen2.5-0.5B's exact shape (benchmarks/real_size_model.py, built once and
cached) and takes GRPO train steps on the workload of issue 28: 4 prompts x 8 samples of the
2-digit addition task ("ab+cd=" in the embedded character tokenizer, 8 new tokens), one
optimizer step of 32 samples in one micro-batch, fp32, KL 0.01 to the reference (k3).

Variants, interleaved A/B on the same backend (one copy of the model: two would not fit the
machine), after one warm-up step (Adam's state is allocated there):
  old   the LM head and log-softmax at every position, prompt included, the entropy metric at
        every position; the reference as a full-size float32 copy, swapped through a clone of
        each parameter; AdamW foreach (the code before issue 28's changes)
  new   logits only from the first completion position on (logits_to_keep), the entropy at the
        trained positions; the reference in bfloat16 (its values are exact there), upcast into
        the parameters while the live values are parked; AdamW fused (the defaults). The phase columns tell the
        changes apart (logprob passes, forward and backward: the logits; reference_swap;
        entropy; optimizer)
  full-logits, old-reference, foreach   new but for one part of the old path each (the
        whole old path needs ~12 GiB at its peak: on a shared 23 GiB machine it may not fit)

Per step it prints the wall time and its phases (logprob passes without gradients, the
reference weight swap, the training forward + loss, backward, entropy metric, grad clip,
optimizer), the process's peak RSS during the step (VmHWM, reset before each step) and its RSS
after; then the bytes of every copy of the model the backend holds. Writes the same figures to
benchmarks/results/<date>-train-step-real-size.md (--no-write: print only).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from real_size_model import ensure_real_size_model

import trainer_svc.backends.dtensor.backend as backend_module
from coordinator.embedded.tiny_model import char_tokenizer
from trainer_svc.backends.dtensor import DTensorBackend
from trainer_svc.backends.dtensor.parallel import local_value
from trainer_svc.backends.reference import _reference_copy, expand_copy
from trainer_svc.config import TrainerSettings
from trainer_svc.distributed import close_distributed, init_distributed
from trainer_svc.types import GrpoLossConfig, Sample

PHASES = ("logprob_passes", "reference_swap", "train_forward_loss", "backward", "entropy", "clip", "optimizer")


def make_samples(prompts: int, generations: int, new_tokens: int, seed: int = 0) -> list[Sample]:
    """`prompts` addition problems x `generations` completions of random digit tokens."""
    tok = char_tokenizer()
    gen = torch.Generator().manual_seed(seed)
    digits = tok.encode("0123456789", add_special_tokens=False).ids
    samples = []
    for _ in range(prompts):
        a, b = (int(x) for x in torch.randint(10, 100, (2,), generator=gen))
        prompt = tok.encode(f"{a}+{b}=").ids
        advantages = torch.randn(generations, generator=gen)
        advantages = (advantages - advantages.mean()) / advantages.std()
        for g in range(generations):
            completion = [digits[int(i)] for i in torch.randint(0, 10, (new_tokens,), generator=gen)]
            logprobs = (-11.9 - 0.05 * torch.rand(new_tokens, generator=gen)).tolist()  # ~ log(1/151936)
            samples.append(Sample(tuple(prompt + completion), len(prompt), generation_logprobs=tuple(logprobs),
                                  advantage=float(advantages[g])))
    return samples


class PhaseClock:
    """Wraps the backend's pieces to add up the seconds of each phase of a train step."""

    def __init__(self, backend: DTensorBackend):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        backend._score = self.wrap("logprob_passes", backend._score)
        backend._optimizer.step = self.wrap("optimizer", backend._optimizer.step)
        backend_module.clip_grad_norm = self.wrap("clip", backend_module.clip_grad_norm)
        self.entropy = {False: self.wrap("entropy", backend_module.masked_entropy_sum),
                        True: self.wrap("entropy", _old_entropy_sum)}
        backward = torch.Tensor.backward
        torch.Tensor.backward = self.wrap("backward", backward)

    def wrap(self, phase: str, call):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start
                self.calls[phase] += 1
        return timed

    @contextmanager
    def step(self, into: dict[str, float]):
        self.seconds.clear()
        self.calls.clear()
        _reset_peak_rss()
        start = time.perf_counter()
        yield
        total = time.perf_counter() - start
        into.update(self.seconds)
        into["total"] = total
        # the rest of the step: the training forward, the loss and the batch's collation
        into["train_forward_loss"] = total - sum(v for k, v in self.seconds.items())
        into["peak_rss_gib"] = _status_gib("VmHWM")
        into["rss_after_gib"] = _status_gib("VmRSS")
        into["logprob_pass_count"] = self.calls["logprob_passes"]


OLD_PARTS = {"old": {"logits", "reference", "optimizer"}, "full-logits": {"logits"}, "old-reference": {"reference"},
             "foreach": {"optimizer"}}
"""Variants with some parts of the old path (any other name: all new)."""


def use_variant(backend: DTensorBackend, clock: PhaseClock, name: str) -> None:
    """Switch the backend to `name`'s parts of the old path (see the module doc), exactly: the
    reference copies hold the initial weights between steps, in either form."""
    parts = OLD_PARTS.get(name, set())
    backend.completion_logits_only = "logits" not in parts
    backend_module.masked_entropy_sum = clock.entropy["logits" in parts]
    for group in backend._optimizer.param_groups:  # read at each step; the same state either way
        group["fused"], group["foreach"] = "optimizer" not in parts, "optimizer" in parts
    ref = backend._reference
    old = "reference" in parts
    for i, (param, copy) in enumerate(zip(ref._params, ref._copies)):
        live = local_value(param)
        if old and copy.dtype != live.dtype:
            ref._copies[i] = expand_copy(copy, live)
        elif not old and copy.dtype == live.dtype:
            ref._copies[i] = _reference_copy(copy, True)
    new_swap = type(ref)._swap.__get__(ref)
    ref._swap = clock.wrap("reference_swap", (lambda **kw: _old_swap(ref)) if old else new_swap)


@torch.no_grad()
def _old_entropy_sum(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """masked_entropy_sum before issue 28: the entropy at every position, then masked."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (-(logp.exp() * logp).sum(dim=-1) * mask).sum()


@torch.no_grad()
def _old_swap(ref) -> None:
    """ReferenceWeights._swap before issue 28: a clone of each live parameter as the temporary."""
    for param, copy in zip(ref._params, ref._copies):
        live = ref._local(param).detach()
        tmp = live.clone()
        live.copy_(copy)
        copy.copy_(tmp)


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS


def _status_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def model_copies(backend: DTensorBackend) -> dict[str, float]:
    """GiB of each copy of the model the backend holds now."""
    def gib(tensors) -> float:
        return sum(t.numel() * t.element_size() for t in tensors) / 2**30
    local = [local_value(p) for p in backend._params]
    grads = [local_value(p.grad) for p in backend._params if p.grad is not None]
    state = [v for s in backend._optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"parameters": gib(local), "gradients (between steps)": gib(grads), "optimizer state": gib(state),
            "reference (new form)": gib(backend._reference._copies)}


def _row(name: str, m: dict[str, float]) -> str:
    phases = " | ".join(f"{m.get(p, 0.0):.2f}" for p in PHASES)
    return (f"| {name} | {m['total']:.2f} | {phases} | {m['logprob_pass_count']} | {m['peak_rss_gib']:.2f} "
            f"| {m['rss_after_gib']:.2f} |")


def report(args, samples: list[Sample], load_line: str, rows: list[str], runs: dict[str, list[dict[str, float]]],
           copies: dict[str, float]) -> str:
    """The result file's markdown."""
    header = ("| variant | step s | " + " | ".join(PHASES) + " | no-grad passes | peak RSS GiB | RSS after GiB |\n"
              "|" + " --- |" * (len(PHASES) + 5))
    lines = [f"# The trainer's GRPO train step at {args.shape}'s shape: {datetime.date.today()}", "",
             (f"`PYTHONPATH=. .venv/bin/python benchmarks/train_step_real_size.py --reps {args.reps} "
              f"--variants {args.variants}` (one process, "
              f"one gloo rank, {torch.get_num_threads()} threads); {args.prompts} prompts x {args.generations} samples "
              f"of {len(samples[0].token_ids)} tokens ({args.new_tokens} new), one micro-batch, fp32, KL 0.01 (k3)."),
             load_line, "", header, *rows, "", "Medians:", ""]
    for name, figures in runs.items():
        lines.append(f"- {name}: step {statistics.median(f['total'] for f in figures):.2f} s, peak RSS "
                     f"{statistics.median(f['peak_rss_gib'] for f in figures):.2f} GiB")
    lines += ["", "Copies of the model held by the backend after the steps (GiB):", ""]
    lines += [f"- {k}: {v:.2f}" for k, v in copies.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b", help="a size of benchmarks/real_size_model.py SHAPES")
    parser.add_argument("--reps", type=int, default=2, help="A/B pairs after the warm-up step")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--variants", default="old,new", help=f"comma-separated: new, {', '.join(OLD_PARTS)}")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    model_dir = ensure_real_size_model(args.shape)
    env = init_distributed(600)
    start = time.perf_counter()
    backend = DTensorBackend(TrainerSettings(model_name=str(model_dir)), env)
    load_s = time.perf_counter() - start
    load_rss = (_status_gib("VmHWM"), _status_gib("VmRSS"))
    clock = PhaseClock(backend)
    samples = make_samples(args.prompts, args.generations, args.new_tokens)
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.01, reference_policy_kl_type="k3", ratio_clip_min=0.2,
                          ratio_clip_max=0.2, kl_input_clamp_value=None, kl_output_clamp_value=None,
                          use_importance_sampling_correction=False)
    n = len(samples)
    rows: list[str] = []
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    order = ["warm-up (new)"] + [v for _ in range(args.reps) for v in args.variants.split(",")]
    for name in order:
        use_variant(backend, clock, name)
        figures: dict[str, float] = {}
        with clock.step(figures):
            result = backend.train_step(samples, loss, n, n, None)
        figures["loss"] = result.metrics["loss"]
        rows.append(_row(name, figures))
        print(rows[-1], f"loss {figures['loss']:.6f}", flush=True)
        if not name.startswith("warm-up"):
            runs[name].append(figures)
    text = report(args, samples, f"Backend load: {load_s:.1f} s, peak RSS {load_rss[0]:.2f} GiB, RSS after "
                        f"{load_rss[1]:.2f} GiB.", rows, runs, model_copies(backend))
    print(text)
    if not args.no_write:
        out = Path(__file__).parent / "results" / f"{datetime.date.today()}-train-step-real-size.md"
        out.write_text(text)
        print(f"written: {out}")
    backend.close()
    close_distributed()


if __name__ == "__main__":
    main()
