"""The checker of benchmarks/chaos.py: whether a run that took faults equals the same seed's run
without them (`check`; an asynchronous one: `check_async`), what a live run leaves in its
directory (read as tests/integration/run_files.py reads it), and the figures the benchmark writes.

Equal means: every GRPO step's training figures (COMPARED) and the exported final weights within
`tolerance` of the fault-free run's (fp32 over gloo: in practice bit for bit, because every
recovery replays from a checkpoint that holds the trainer's state, the data cursor and the RNG,
and every sample's sampling seed is global: coordinator/loop/rollout.py), and every step trained
the same prompts, every sample accounted for (the runs' ledgers: coordinator/loop/ledger.py);
nothing the run started
alive at the end (any process whose environment names the run's TANDEM_HOME); the checkpoint
directory holding every checkpoint it claims (`latest`, and the last checkpointing.keep_top_k
saves its coordinator logged, each complete).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coordinator.launch.launcher import kill_tree
from coordinator.loop.ledger import StepSamples, account

# --- what a live run leaves in its directory (as tests/integration/run_files.py reads it) -----

def grpo_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if row.get("phase") == "grpo":
            rows.append(row)
    return rows


def last_step(run_dir: Path) -> int:
    return max((r["step"] for r in grpo_rows(run_dir)), default=0)


def joins(run_dir: Path) -> int:
    """Services that registered with the run's coordinators so far (member_joined in coordinator.log)."""
    log = run_dir / "logs" / "coordinator.log"
    try:
        return log.read_text(errors="replace").count('"event": "member_joined"')
    except OSError:
        return 0


def services(run_dir: Path) -> dict[str, int]:
    try:
        return {n: e["pid"] for n, e in json.loads((run_dir / "services.json").read_text()).items()}
    except (OSError, json.JSONDecodeError, KeyError):
        return {}


def torchrun_rank(agent: int, rank: int) -> int | None:
    """The pid of torchrun's worker with RANK=`rank`, None if it has none now."""
    try:
        for task in Path(f"/proc/{agent}/task").iterdir():
            for child in (task / "children").read_text().split():
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                if f"RANK={rank}".encode() in env:
                    return int(child)
    except OSError:
        return None
    return None


def processes_of(home: Path) -> list[int]:
    """Every live process (not a zombie) whose environment holds TANDEM_HOME=home: whatever the
    run started, at any depth, whoever its parent is now."""
    needle = f"TANDEM_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and process_state(int(entry.name)) != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


# --- the checker ----------------------------------------------------------------------------

COMPARED = ("loss", "pg_loss", "reward_mean", "accuracy_train", "grad_norm", "kl", "entropy",
            "token_mult_prob_error", "completion_length_mean", "num_samples", "num_tokens", "advantage_abs_mean")
"""The per-step figures of training. Not compared: timings, weight versions (a restart publishes
the restored weights as a new version), service restart counts."""


@dataclass
class Verdict:
    equal: bool
    steps_equal: bool
    weights_equal: bool
    max_metric_diff: float
    max_weight_diff: float
    left_running: list[int]
    checkpoints_ok: bool
    problems: list[str]

    asynchronous: bool = False
    faults_ok: bool = True
    """Every fault met its kind's expectation (`fault_problems`)."""

    @property
    def passed(self) -> bool:
        return self.equal and not self.left_running and self.checkpoints_ok and self.faults_ok

    @property
    def text(self) -> str:
        if self.asynchronous:
            return "nothing lost, nothing twice" if self.passed else "LOST OR TWICE: " + "; ".join(self.problems)
        if self.passed:
            exact = self.max_metric_diff == 0 and self.max_weight_diff == 0
            return "equal to the fault-free run" + (" (bit for bit)" if exact else
                                                    f" (within 1e-6: metrics {self.max_metric_diff:.2g}, "
                                                    f"weights {self.max_weight_diff:.2g})")
        return "NOT equal: " + "; ".join(self.problems)


def fault_problems(faults) -> list[str]:
    """What the faults themselves must show (benchmarks/chaos.py's Injected records): each one
    recovered from (the run went on: none stalled it for good), and a slow generator never
    declared dead (killed or replaced) while it still made progress."""
    problems = []
    for f in faults:
        if f.recovered_s is None:
            problems.append(f"{f.kind} at {f.at_s:.0f}s did not recover: {f.note}")
        if f.kind == "slow_generator" and "DECLARED DEAD" in f.note:
            problems.append(f"a slow generator (still running, {f.hang_s:g}s slow) was declared dead at {f.at_s:.0f}s: "
                            f"{f.note}")
    return problems


def check(reference_dir: Path, chaos_dir: Path, home: Path, *, tolerance: float = 1e-6,
          settle_s: float = 15.0, checkpoints: Path | None = None, faults=()) -> Verdict:
    """checkpoints: where the run's checkpoints are (default <chaos_dir>/checkpoints). faults:
    the Injected records, held to `fault_problems`."""
    from safetensors.torch import load_file

    problems: list[str] = []
    ref, got = grpo_rows(reference_dir), grpo_rows(chaos_dir)
    max_diff, steps_equal = 0.0, [r["step"] for r in ref] == [r["step"] for r in got]
    if not steps_equal:
        problems.append(f"steps logged {_steps([r['step'] for r in got])}, not {_steps([r['step'] for r in ref])}")
    for a, b in zip(ref, got):
        for key in (k for k in COMPARED if k in a):
            if key not in b or math.isnan(b[key]):
                problems.append(f"step {a['step']}: {key} missing")
                steps_equal = False
                continue
            diff = abs(a[key] - b[key])
            max_diff = max(max_diff, diff)
            if diff > tolerance:
                steps_equal = False
                problems.append(f"step {a['step']}: {key} {b[key]!r} != {a[key]!r}")
    weights_equal, max_weight_diff = False, math.inf
    try:
        wa, wb = (load_file(d / "hf" / "model.safetensors") for d in (reference_dir, chaos_dir))
        if wa.keys() == wb.keys():
            max_weight_diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
            weights_equal = max_weight_diff <= tolerance
        if not weights_equal:
            problems.append(f"final weights differ (max |diff| {max_weight_diff:.3g})")
    except OSError as exc:
        problems.append(f"no final weights ({type(exc).__name__})")
    steps_equal &= _same_samples(reference_dir, chaos_dir, problems)
    left = _left_running(home, settle_s)
    if left:
        problems.append(f"left running: {[(p, _cmdline(p)) for p in left]}")
    checkpoints_ok = _check_checkpoints(chaos_dir, problems, checkpoints)
    faulty = fault_problems(faults)
    return Verdict(steps_equal and weights_equal, steps_equal, weights_equal, max_diff, max_weight_diff, left,
                   checkpoints_ok, problems + faulty, faults_ok=not faulty)


def _same_samples(reference_dir: Path, chaos_dir: Path, problems: list[str]) -> bool:
    """Synchronous: the ledger of the run with faults accounts for every sample (none twice, none
    lost, every one sampled by the weights its step trained: age 0), and each step trained the
    same prompts as the fault-free run's (versions may differ: a restart publishes the restored
    weights as a new version)."""
    (ref, ref_broken), (got, got_broken) = ledger(reference_dir), ledger(chaos_dir)
    found = got_broken + [f"fault-free run: {p}" for p in ref_broken]
    if ref and not found:
        found += account(got, steps=len(ref), groups=len(ref[0].trained),
                         generations=len(ref[0].trained[0].versions), max_age=0)
        for a, b in zip(ref, got):
            if [g.draw for g in a.trained] != [g.draw for g in b.trained]:
                found.append(f"step {a.step}: trained prompts {[g.draw for g in b.trained]}, "
                             f"not {[g.draw for g in a.trained]}")
    problems += [f"ledger: {p}" for p in found]
    return not found


def _cmdline(pid: int) -> str:
    """What the process runs, without paths: `-m module`, or the program's file name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    return Path(argv[0]).name if argv and argv[0] else "?"


def _steps(steps: list[int]) -> str:
    """1..61 for a contiguous list, else the list."""
    return f"{steps[0]}..{steps[-1]}" if steps and steps == list(range(steps[0], steps[-1] + 1)) else str(steps)


def _check_checkpoints(run_dir: Path, problems: list[str], root: Path | None = None) -> bool:
    """`latest` names a complete checkpoint; so does every checkpoint the run's last session
    logged as saved that keep_top_k keeps; every step directory there is complete."""
    import yaml

    root = root or run_dir / "checkpoints"
    if not (run_dir / "config.yaml").is_file():
        problems.append("no config.yaml: the run stopped before it began (its console says why)")
        return False
    keep = yaml.safe_load((run_dir / "config.yaml").read_text())["checkpointing"]["keep_top_k"]
    ok = True
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
    if latest is None or not _complete(root / latest):
        problems.append(f"latest ({latest}) is not a complete checkpoint")
        ok = False
    saved = []
    for line in (run_dir / "logs" / "coordinator.log").read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "checkpoint_saved":
            saved.append(Path(event["path"]).name)
    claimed = sorted(set(saved))[-keep:]
    for name in claimed:
        if not _complete(root / name):
            problems.append(f"{name} was logged as saved but is not complete on disk")
            ok = False
    for path in root.glob("step_*"):
        if not _complete(path):
            problems.append(f"{path.name} is incomplete")
            ok = False
    return ok


def _complete(path: Path) -> bool:
    trainer = path / "trainer"
    return ((path / "coordinator.json").is_file() and (trainer / "trainer_state.json").is_file()
            and any((trainer / "dcp").glob(".metadata")))


def check_async(run_dir: Path, home: Path, *, steps: int, groups: int, generations: int, max_age: int,
                settle_s: float = 15.0, checkpoints: Path | None = None, faults=()) -> Verdict:
    """An asynchronous run has no fault-free twin to equal: which weights sampled a batch depends on
    timing. What it must keep: every step 1..steps trained once in the run's final history (a
    restart drops the rows after its checkpoint and trains those steps again, on the restored
    state), each on a full batch (`groups` x `generations` samples), none older than `max_age`
    versions; every sample accounted for by the run's ledger (`account`: none trained twice, none
    lost, each drop with its reason); the exported weights; nothing left running; the
    checkpoints it claims; the faults' own expectations (`fault_problems`)."""
    batch = groups * generations
    records, problems = ledger(run_dir)
    problems += account(records, steps=steps, groups=groups, generations=generations, max_age=max_age)
    rows = grpo_rows(run_dir)
    logged = [r["step"] for r in rows]
    if logged != list(range(1, steps + 1)):
        twice = sorted({s for s in logged if logged.count(s) > 1})
        lost = sorted(set(range(1, steps + 1)) - set(logged))
        problems.append(f"steps trained twice {twice}, lost {lost}")
    for row in rows:
        if row.get("num_samples") != batch:
            problems.append(f"step {row['step']}: {row.get('num_samples')} samples, not {batch}")
        if row.get("trajectory_age_max", 0) > max_age:
            problems.append(f"step {row['step']}: a trajectory {row['trajectory_age_max']} versions old (bound {max_age})")
    if not (run_dir / "hf" / "model.safetensors").is_file():
        problems.append("no final weights")
    left = _left_running(home, settle_s)
    if left:
        problems.append(f"left running: {[(p, _cmdline(p)) for p in left]}")
    checkpoints_ok = _check_checkpoints(run_dir, problems, checkpoints)
    problems += fault_problems(faults)
    fine = not problems
    return Verdict(fine, fine, fine, 0.0, 0.0, left, checkpoints_ok, problems, asynchronous=True)


def ledger(run_dir: Path) -> tuple[list[StepSamples], list[str]]:
    """<run>/ledger.jsonl's records (coordinator/loop/ledger.py), in order, and its unreadable lines."""
    path = run_dir / "ledger.jsonl"
    records, problems = [], []
    for number, line in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        try:
            records.append(StepSamples.from_json(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"ledger.jsonl line {number} unreadable ({type(exc).__name__})")
    if not path.is_file():
        problems.append("no ledger.jsonl")
    return records, problems


def ledger_figures(run_dir: Path) -> dict:
    """What an async run's ledger accounts for: samples trained, prompts drawn, groups' samples
    dropped (by reason), and the resumes its history went through (coordinator.log)."""
    records, _ = ledger(run_dir)
    dropped: dict[str, int] = {}
    for record in records:
        for d in record.dropped:
            dropped[d.reason.value] = dropped.get(d.reason.value, 0) + len(d.group.versions)
    draws = {g.draw for r in records for g in r.trained} | {d.group.draw for r in records for d in r.dropped}
    log = run_dir / "logs" / "coordinator.log"
    resumes = log.read_text(errors="replace").count('"event": "resumed"') if log.is_file() else 0
    return {"trained": sum(len(g.versions) for r in records for g in r.trained), "draws": len(draws),
            "dropped": sum(dropped.values()), "dropped_by_reason": dropped, "resumes": resumes}


def _left_running(home: Path, settle_s: float) -> list[int]:
    left = processes_of(home)
    deadline = time.monotonic() + settle_s  # a service told to stop may take a moment
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_of(home)
    return left


def stop_everything(home: Path, timeout_s: float = 30.0) -> list[int]:
    """SIGKILL whatever the run left (after a failed run: services outlive a killed coordinator by
    design, for their coordinator_wait_s); returns the pids killed. Each process found
    (`processes_of`) goes with its process group and every descendant (vLLM's engine processes,
    torchrun's ranks), by pid; the search is repeated until it finds nothing (up to timeout_s),
    so that a service a still-living supervisor relaunched meanwhile goes too."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while (left := processes_of(home)) and time.monotonic() < deadline:
        for pid in left:
            kill_tree(pid)
        killed.update(left)
        time.sleep(0.2)  # killed processes leave /proc (or become zombies) once the kernel has reaped them
    return sorted(killed)


# --- figures --------------------------------------------------------------------------------

def figures(outcome, verdict: Verdict, seed: int, steps: int, rate: float) -> dict:
    """What benchmarks/chaos.py writes: its Outcome's faults, recovery per kind, the verdict."""
    by_kind: dict[str, list[float]] = {}
    for f in outcome.faults:
        if f.recovered_s is not None:
            by_kind.setdefault(f.kind, []).append(f.recovered_s)
    survived = sum(f.recovered_s is not None for f in outcome.faults)
    return {
        "seed": seed, "steps": steps, "rate_per_min": rate, "wall_s": round(outcome.wall_s, 1),
        "returncode": outcome.returncode, "launches": outcome.launches,
        "faults_injected": len(outcome.faults), "faults_survived": survived,
        "kinds": len(by_kind), "faults_per_hour": round(survived / outcome.wall_s * 3600, 1),
        "recover_s": {k: {"n": len(v), "median": round(statistics.median(v), 2), "max": max(v)}
                      for k, v in sorted(by_kind.items())},
        "stopped_detected_s": _spread([f.detected_s for f in outcome.faults if f.detected_s is not None]),
        "stopped_replaced_s": _spread([f.replaced_s for f in outcome.faults if f.replaced_s is not None]),
        "skipped": outcome.skipped, "verdict": verdict.text, "left_running": verdict.left_running,
        "max_metric_diff": verdict.max_metric_diff, "max_weight_diff": verdict.max_weight_diff,
        "faults": [asdict(f) for f in outcome.faults],
    }


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "median": round(statistics.median(values), 2), "max": max(values)} if values else {"n": 0}


def markdown(result: dict) -> str:
    """The figures as a dated results page: the verdict, faults survived, recovery per kind."""
    rows = "\n".join(f"| {kind} | {r['n']} | {r['median']} | {r['max']} |" for kind, r in result["recover_s"].items())
    replaced = sum("replaced" in f["note"] for f in result["faults"])
    books = result.get("ledger")
    accounted = (f" Its ledger accounts for {books['trained']} samples trained ({books['draws']} prompts drawn) and "
                 f"{books['dropped']} dropped ({books['dropped_by_reason'] or 'none'}), across {books['resumes']} "
                 "resumes from a checkpoint." if books else "")
    compared = ("Asynchronous GRPO (rollouts up to one step ahead): checked by check_async, with no fault-free twin: "
                f"every sample id (prompt draw, generation, weight version) in the run's ledger.jsonl.{accounted}"
                if result.get("asynchronous") else
                f"The same seed without faults took {result.get('reference_wall_s', 0):.0f} s. Largest difference "
                f"from it: per-step figures {result['max_metric_diff']}, final weights {result['max_weight_diff']}.")
    return (f"# Chaos run, seed {result['seed']}: {result['verdict']}\n\n"
            f"`{result.get('command', 'benchmarks/chaos.py')}`\n\n"
            f"A real `tandem run` of {result['steps']} GRPO steps (embedded tiny model, 2 trainer ranks over gloo, "
            f"1 vLLM generator, 1 reward service, fp32, a checkpoint every step) took "
            f"{result['faults_injected']} faults of {result['kinds']} kinds in {result['wall_s']:.0f} s and survived "
            f"{result['faults_survived']} ({result['faults_per_hour']} per hour of run; {result['launches']} launches "
            f"of the same command; {replaced} hangs outlasted cluster.stopped_kill_s and were replaced). "
            f"{compared}\n\n"
            "Time to recover (s): from the fault to the run logging the second GRPO step past the last one logged "
            "before it (so about one step's time is included); hangs include the time stopped, partitions and slow "
            "generators the time they lasted.\n\n"
            f"| fault | n | median | max |\n| --- | --- | --- | --- |\n{rows}\n{_detection(result)}")


def _detection(result: dict) -> str:
    """How soon the run found a stopped service and had it back, over the hangs it replaced."""
    found, back = result.get("stopped_detected_s", {"n": 0}), result.get("stopped_replaced_s", {"n": 0})
    if not found["n"]:
        return ""
    line = (f"\nStopped services the run detected and killed (hangs past cluster.stopped_kill_s): {found['n']}, "
            f"killed {found['median']} s (median), {found['max']} s (max) after the SIGSTOP")
    if back["n"]:
        line += f"; their replacements registered {back['median']} s (median), {back['max']} s (max) after it"
    return line + ".\n"
