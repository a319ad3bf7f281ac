"""benchmarks/real_size.py's figures: what each run measured (`SystemRep`, read back from a Tandem
run directory by `tandem_rep`), what the invocation measured besides (`Results`), and the result
file (`render`: Markdown, printed and written under benchmarks/results/). No torch, no TRL: the
unit tests build these from made-up figures.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from proc_memory import Peaks, parse_events

GIB_KIB = 1 << 20


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


@dataclass
class SystemRep:
    """One run of one system."""

    system: str
    step_s: list[float]
    """Wall seconds of each GRPO step."""
    phases: dict[str, float]
    """Median seconds per step of each phase, over the steps after the first."""
    startup_s: float
    """Launch to the first step's start (Tandem: to its held-out validation before GRPO)."""
    memory: Peaks
    """Peak PSS in KiB, per service kind and of the whole tree."""
    publish_phase_s: list[float] = field(default_factory=list)
    """Tandem: each step's time_publish_s (the loop's publish phase: RPCs, the send, the generators' swap)."""
    publish_send_s: list[float] = field(default_factory=list)
    """Tandem: each publish's transport send as the coordinator timed it (`weights_published` seconds)."""
    publish_trainer_s: list[float] = field(default_factory=list)
    """Tandem: each publish as the trainer timed it (its `weights_published` duration_ms): gather + broadcast."""
    publish_bytes: int = 0
    checkpoint_s: list[float] = field(default_factory=list)
    """Tandem: seconds of each save (timings_s.checkpoint_s over the `checkpoint_saved` events)."""
    command: str = ""
    members_lost: list[str] = field(default_factory=list)
    """Tandem: the coordinator's `member_lost` events (kind:member id): a healthy run has none."""
    token_mult_prob_error: list[float] = field(default_factory=list)
    """Tandem: each GRPO step's token_mult_prob_error (the generator's against the trainer's
    probabilities of the sampled tokens: 1.0 when the generator serves exactly what the trainer has)."""

    @property
    def median_step_s(self) -> float:
        return median(self.step_s[1:] or self.step_s)


@dataclass
class Results:
    machine: str
    command: str
    shape: object
    model: dict
    """benchmarks/real_size_model.py's line: parameters, bytes, seconds."""
    settings: object
    save_every: int
    reps: dict[str, list[SystemRep]] = field(default_factory=dict)
    publish_bytes: int = 0
    broadcast_s: list[float] = field(default_factory=list)
    checkpoint_bytes: int | None = None
    disk_s: tuple[float, float] | None = None
    """(write + fsync, cold read) seconds of checkpoint_bytes."""
    resumes: list[dict] = field(default_factory=list)
    """benchmarks/real_size.py's Bench.resume figures, in the order run."""


def events(path: Path, name: str) -> list[dict]:
    """The events of that name in a JSON-lines log (none if it does not exist)."""
    if not path.is_file():
        return []
    return [e for e in parse_events(path.read_text(errors="replace").splitlines()) if e.get("event") == name]


def tandem_rep(system: str, run_dir: Path, launched: float, memory: Peaks, command: str) -> SystemRep:
    """A finished Tandem run's figures: steps and phases from metrics.jsonl, the publishes from the
    coordinator's and the trainer's logs, the checkpoint saves from summary.json."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = sorted((r for r in rows if r["phase"] == "grpo"), key=lambda r: r["step"])
    start = next(r["time"] for r in rows if r["phase"] == "val" and r["step"] == 0)
    ends = [start] + [r["time"] for r in steps]
    keys = sorted({k for r in steps for k in r if k.startswith("time_") and k.endswith("_s") and k != "time_step_s"})
    later = steps[1:] or steps
    phases = {k[len("time_"):-len("_s")]: median([r.get(k) for r in later]) for k in keys}
    logs = run_dir / "logs"
    sent = events(logs / "coordinator.log", "weights_published")
    trainer = [e for e in events(logs / "trainer.log", "weights_published") if "duration_ms" in e]
    saves = len(events(logs / "coordinator.log", "checkpoint_saved"))
    summary = json.loads((run_dir / "summary.json").read_text())
    total = summary.get("timings_s", {}).get("checkpoint_s")
    return SystemRep(system, [b - a for a, b in itertools.pairwise(ends)], phases, start - launched, memory,
                     publish_phase_s=[r["time_publish_s"] for r in steps if "time_publish_s" in r],
                     publish_send_s=[float(e["seconds"]) for e in sent],
                     publish_trainer_s=[e["duration_ms"] / 1000 for e in trainer],
                     publish_bytes=max((int(e.get("bytes") or 0) for e in sent), default=0),
                     checkpoint_s=[total / saves] * saves if saves and total is not None else [], command=command,
                     members_lost=[f"{e.get('kind')}:{e.get('member_id')}"
                                   for e in events(logs / "coordinator.log", "member_lost")],
                     token_mult_prob_error=[r["token_mult_prob_error"] for r in steps if "token_mult_prob_error" in r])


def gib(kib: int) -> str:
    return f"{kib / GIB_KIB:.2f}"


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else f"{values[0]:.2f}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def rep_line(rep: SystemRep) -> str:
    """One run, in a line (printed as each run ends)."""
    steps = ", ".join(f"{s:.2f}" for s in rep.step_s)
    phases = " ".join(f"{k} {v:.2f}" for k, v in rep.phases.items())
    memory = " ".join(f"{k} {gib(v)}" for k, v in sorted(rep.memory.groups.items()))
    return (f"{rep.system}: s/step {steps}; start-up {rep.startup_s:.1f} s; phases (median s/step) {phases}; "
            f"peak PSS GiB: whole {gib(rep.memory.whole)} ({memory}; {rep.memory.samples} samples)")


def _steps_table(results: Results) -> list[str]:
    lines = ["| system | rep | s/step (each step) | median s/step (after the first) | start-up s | phases, median s/step |",
             "| --- | --- | --- | --- | --- | --- |"]
    for system, runs in results.reps.items():
        for i, r in enumerate(runs):
            phases = ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items())
            lines.append(f"| {system} | {i + 1} | {', '.join(f'{s:.2f}' for s in r.step_s)} | {r.median_step_s:.2f} "
                         f"| {r.startup_s:.1f} | {phases} |")
    trl = [r.median_step_s for r in results.reps.get("trl", [])]
    for system, runs in results.reps.items():
        if system != "trl" and trl:
            lines.append(f"\n{system} / TRL median s/step: {median([r.median_step_s for r in runs]) / median(trl):.2f}x")
    return lines


def _memory_table(results: Results) -> list[str]:
    kinds = sorted({k for runs in results.reps.values() for r in runs for k in r.memory.groups})
    lines = ["| system | rep | whole tree | " + " | ".join(kinds) + " | at the whole tree's peak | samples |",
             "| --- | --- | --- | " + " | ".join("---" for _ in kinds) + " | --- | --- |"]
    for system, runs in results.reps.items():
        for i, r in enumerate(runs):
            at_peak = ", ".join(f"{k} {gib(v)}" for k, v in sorted(r.memory.at_whole.items()))
            cells = " | ".join(gib(r.memory.groups[k]) if k in r.memory.groups else "-" for k in kinds)
            lines.append(f"| {system} | {i + 1} | {gib(r.memory.whole)} | {cells} | {at_peak} | {r.memory.samples} |")
    return lines


def _publish_lines(results: Results) -> list[str]:
    raw = median(results.broadcast_s)
    mib = results.publish_bytes / 2**20
    lines = [f"- bytes a publish sent: {results.publish_bytes} ({mib:.0f} MiB)",
             (f"- raw gloo broadcast of as many bytes between two processes (barrier, broadcast, barrier; "
             f"{len(results.broadcast_s)} repeats): {_span(results.broadcast_s)} s, {mib / 1024 / raw:.2f} GiB/s")]
    for system, runs in results.reps.items():
        if system == "trl":
            continue
        for name, attr in (("the step's publish phase (time_publish_s)", "publish_phase_s"),
                           ("the coordinator's transport send (weights_published seconds)", "publish_send_s"),
                           ("the trainer's side: gather and broadcast (its weights_published duration_ms)",
                            "publish_trainer_s")):
            values = [v for r in runs for v in getattr(r, attr)]
            ratio = f"; {median(values) / raw:.2f}x the raw broadcast" if values and not math.isnan(raw) else ""
            lines.append(f"- {system}, {name}: {_span(values)} s over {len(values)}{ratio}")
    return lines


def _checkpoint_lines(results: Results) -> list[str]:
    lines = []
    for system, runs in results.reps.items():
        saves = [v for r in runs for v in r.checkpoint_s]
        if system != "trl":
            lines.append(f"- {system}: a save {_span(saves)} s, {len(saves)} save(s) (timings_s.checkpoint_s "
                         f"over the checkpoint_saved events)")
    if results.checkpoint_bytes is not None:
        lines.append(f"- a checkpoint's bytes (the latest step directory): {results.checkpoint_bytes} "
                     f"({results.checkpoint_bytes / 2**30:.2f} GiB)")
    if results.disk_s is not None:
        write, read = results.disk_s
        size = (results.checkpoint_bytes or 0) / 2**30
        lines.append(f"- the disk, the same bytes in one file beside the checkpoints: write + fsync {write:.2f} s "
                     f"({size / write:.2f} GiB/s), cold read {read:.2f} s ({size / read:.2f} GiB/s)")
    if len(results.resumes) == 1:
        resume, publish = results.resumes[0].get("resume_s"), results.resumes[0].get("publish_s")
        load = f"; the load without the publish: {resume - publish:.2f} s" if resume and publish is not None else ""
        lines.append(f"- resume (a fresh `tandem run --resume`, the checkpoint evicted from the page cache first): "
                     f"timings_s.resume_s {_number(resume)} s, the trainer's load and the publish of the restored "
                     f"weights (that publish: {_number(publish)} s, its weights_published seconds){load}")
    elif results.resumes:
        lines += _resume_table(results.resumes)
    return lines or ["- no checkpoint measured"]


def _resume_table(resumes: list[dict]) -> list[str]:
    """Each resume of one checkpoint (a fresh `tandem run --resume`, evicted first), in the order
    run, then the medians per checkpointing.direct_io setting."""
    lines = [("- resumes of one checkpoint, in the order run (each a fresh `tandem run --resume` for one more "
              "step, the checkpoint evicted from the page cache first; resume_s: the trainer's load and the publish "
              "after it; reload and waited: the generator's in that publish, its weights_swapped event; wall: launch "
              "to exit):"), "",
             "| # | reads | resume_s | its publish | reload | waited | the load | the resumed step | wall |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(resumes):
        resume, publish = r.get("resume_s"), r.get("publish_s")
        load = resume - publish if resume is not None and publish is not None else None
        lines.append(f"| {i + 1} | {r.get('reads', 'config')} | {_number(resume)} | {_number(publish)} | "
                     f"{_number(r.get('reload_s'))} | {_number(r.get('waited_s'))} | {_number(load)} | "
                     f"{_number(r.get('step_s'))} | {_number(r.get('wall_s'))} |")
    lines.append("")
    for reads in dict.fromkeys(r.get("reads", "config") for r in resumes):
        mine = [r for r in resumes if r.get("reads", "config") == reads]
        figures = {key: median([r.get(key) for r in mine])
                   for key in ("resume_s", "publish_s", "reload_s", "step_s", "wall_s")}
        lines.append(f"- {reads} ({len(mine)}): median resume_s {_number(figures['resume_s'])}, publish "
                     f"{_number(figures['publish_s'])} (reload {_number(figures['reload_s'])}), resumed step {_number(figures['step_s'])}, wall "
                     f"{_number(figures['wall_s'])} s")
    return lines


def _liveness_lines(results: Results) -> list[str]:
    """Members the coordinator declared lost in each Tandem rep (a busy trainer must not be one),
    and how far the generator's token probabilities were from the trainer's."""
    lines = []
    for system, reps in results.reps.items():
        for i, rep in enumerate(reps):
            if system == "trl":
                continue
            lines.append(f"- {system} rep {i + 1}: {len(rep.members_lost)} member(s) declared lost"
                         + (f" ({', '.join(rep.members_lost)})" if rep.members_lost else ""))
            errors = rep.token_mult_prob_error
            if errors:
                worst = max(errors, key=lambda e: abs(e - 1.0))
                lines.append(f"  token_mult_prob_error over {len(errors)} steps: {min(errors):.6f}-{max(errors):.6f} "
                             f"(furthest from 1.0: {abs(worst - 1.0):.2e})")
    return lines


def render(results: Results) -> str:
    """The result file: the setup, then steps, memory, publish and checkpoint."""
    s, shape, model = results.settings, results.shape, results.model
    lines = [f"# Tandem and TRL at the {shape.name} shape ({model['parameters'] / 1e6:.1f}M parameters)", "",
             f"Written by benchmarks/real_size.py. Command: `{results.command}`", "", results.machine, "",
             (f"- model: random-init Qwen2ForCausalLM, hidden {shape.hidden_size}, {shape.num_layers} layers, "
             f"{shape.num_heads}/{shape.num_kv_heads} heads, intermediate {shape.intermediate_size}, vocabulary "
             f"{shape.vocab_size}, tied embeddings {shape.tie_word_embeddings}, bf16 on disk "
             f"({model['bytes'] / 2**30:.2f} GiB, built in {model['seconds']:.0f} s)"),
             (f"- workload: 2-digit addition, GRPO {s.num_prompts_per_step} prompts x {s.num_generations} samples, "
             f"{s.max_new_tokens} new tokens, k3 KL {s.kl_beta} to the reference, fp32 training, lr "
             f"{s.learning_rate}, {s.num_steps} steps; one trainer rank and one generator; Tandem checkpoints "
             f"every {results.save_every} steps"), "",
             "## Steps", "", *_steps_table(results), "",
             ("Tandem's phases are metrics.jsonl's time_*_s keys; TRL's: generate (`_generate_single_turn`), "
             "prepare (all of `_generate_and_score_completions`: generation, rewards, reference and old logprobs), "
             "train (the step minus prepare)."), "",
             "## Peak memory (PSS, GiB)", "", *_memory_table(results), "",
             ("Each process tree's PSS summed, sampled from /proc/<pid>/smaps_rollup; trainer: torchrun and its "
             "ranks; generator: with vLLM's engine process; coordinator: the `tandem run` process and whatever "
             "else it started; the whole tree's peak is the largest sum of one sample."), "",
             "## Publish", "", *_publish_lines(results), "",
             "## Checkpoint", "", *_checkpoint_lines(results), "",
             "## Liveness and fidelity", "", *_liveness_lines(results)]
    return "\n".join(lines) + "\n"
