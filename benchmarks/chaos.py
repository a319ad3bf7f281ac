"""Chaos that loses nothing: a nemesis that injects faults at random moments into a real local
`tandem run` (the embedded tiny model, 2 torchrun trainer ranks over gloo, 1 vLLM generator,
1 reward service, fp32), and a checker that compares the outcome with the same seed's run
without faults.

    .venv/bin/python benchmarks/chaos.py --seed 1 --steps 60 --rate 4 --out benchmarks/results

The nemesis (`Nemesis`) runs the `tandem run` CLI as a user would, in its own session, and from a
schedule drawn from the seed (`schedule`) fires one fault after another: each waits a random
delay (exponential, mean 60/rate s) after the run recovered from the previous one, then lands
wherever the run is (a rollout, a publish, a checkpoint). Kinds (`FaultKind`):

- SIGKILL of the generator's or the reward service's process group (the supervisor relaunches
  it), of one trainer rank or of the torchrun agent (the loop relaunches the trainer and resumes
  from the last checkpoint), of the coordinator (the nemesis runs the same command again: it
  resumes by itself and adopts the services that outlived it);
- SIGSTOP, then SIGCONT after hang_s, of the same processes (a hang, not a death);
- a full disk (DISK_FULL, with `--disk-mb`): the run's checkpoints go to a small tmpfs that only
  the run sees (benchmarks/chaos_sandbox.py: a user and mount namespace, no root needed), which the
  nemesis fills to the last byte for hang_s seconds, so the checkpoints written meanwhile fail;
- a network partition of one service (PARTITION: the generator, the reward service or the
  trainer, drawn from the seed) for hang_s seconds: the run lives in a network namespace of its
  own, where every packet between that service and the rest of the run is dropped silently
  (benchmarks/chaos_net.py says how, and which traffic that cuts: gRPC both ways and the
  weight-sync collective);
- a slow generator (SLOW_GENERATOR): for hang_s seconds the generator's process group runs
  SLOW_RUN_S out of every SLOW_STOP_S + SLOW_RUN_S (SIGSTOP/SIGCONT), so it works at about a
  quarter of its speed; it must not be declared dead (replaced) for it, and the run must go on
  (the supervisor tells it from a hang by its context switches: coordinator/launch/supervisor.py).

The services' pids come from where the fault tests read them (tests/integration/run_files.py):
<run>/services.json, torchrun's children by their RANK. Every fault goes to <work>/faults.jsonl
with its moment, the step the run had logged, and how long the run took to recover (to log two
GRPO steps past the last one logged before the fault: RECOVERED_AFTER). A hang the run detects
(stopped past cluster.stopped_kill_s) also records when the run killed the stopped process
(detected_s) and when its replacement registered (replaced_s), both from the SIGSTOP: the bound
on detection is stopped_kill_s plus up to two of the supervisor's looks (one a second).

The checker (`check`): the per-step training figures (loss, rewards, grad norm, KL, ...) and the
exported final weights equal the fault-free run's (fp32 over gloo; exact, because every
recovery replays from a checkpoint that holds the trainer's state, the data cursor and the RNG,
and every sample's sampling seed is global: coordinator/loop/rollout.py), and each step trained
the same prompts (the runs' <run>/ledger.jsonl, coordinator/loop/ledger.py); nothing the run
started is alive at the end (every process whose environment names the run's TANDEM_HOME);
the checkpoint directory holds every checkpoint it claims (`latest` and the last
checkpointing.keep_top_k saves logged, each complete). An asynchronous run (`--async`,
`check_async`) has no fault-free twin: its ledger must account for every sample (none trained
twice, none lost, every step a full batch within the age bound), with the same last two checks.
Both hold the faults to their kinds' expectations (chaos_check.fault_problems): every one
recovered from, and no slow generator declared dead.

Figures go to <out>/chaos-<seed>.json and a line to stdout: faults survived (per hour of run),
time to recover per kind (median, max), the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the checkout's packages, this file's sibling
    sys.path.insert(0, str(ROOT))

from benchmarks.chaos_check import (
    check,
    check_async,
    figures,
    joins,
    last_step,
    ledger_figures,
    markdown,
    services,
    stop_everything,
    torchrun_rank,
)
from benchmarks.chaos_faults import (
    SERVICE_OF,
    SLOW_RUN_S,
    SLOW_STOP_S,
    Fault,
    FaultKind,
    hold_stopped,
    replaced,
    schedule,
    slow_down,
)
from benchmarks.chaos_net import Partition, network_available
from benchmarks.chaos_sandbox import Sandbox
from benchmarks.portable_args import without_paths

RUN_NAME = "chaos"
RECOVERED_AFTER = 2
"""A run has recovered from a fault once it logged this many GRPO steps past the last one logged
before it: the step in flight when it landed (its rollout may have been done already), and one
that began after it. So a recovery time includes about one step's time. A killed generator or
reward service must also have registered again (async GRPO logs steps from batches sampled
before the kill, which charged the relaunch to the next fault)."""


ASYNC_ARGS = ["grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1"]
"""The asynchronous mode: rollouts run up to one step ahead of training."""
PROMPTS, GENERATIONS = 4, 4


def run_args(steps: int, seed: int, run_name: str = RUN_NAME) -> list[str]:
    """`tandem run`'s arguments: GRPO on the embedded task, fp32, a checkpoint every step (a
    short SFT warm start first, so that rewards vary and the steps move the policy)."""
    return ["run", "sft.max_num_steps=60", "sft.val_period=60", "sft.stop_at_accuracy=null",
            f"grpo.max_num_steps={steps}", f"grpo.seed={seed}", "grpo.val_period=0", "grpo.max_val_samples=8",
            f"grpo.num_prompts_per_step={PROMPTS}", f"grpo.num_generations_per_prompt={GENERATIONS}", "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8", "policy.precision=float32", "checkpointing.save_period=1",
            "checkpointing.max_failed_saves=1000",  # a full disk lasts seconds: many steps of the tiny model
            "data.num_train=200", "data.num_val=8", "cluster.trainer_ranks=2", "cluster.num_generators=1",
            "cluster.restart_backoff_s=0.5", "cluster.max_service_restarts=1000", "cluster.max_trainer_restarts=1000",
            "logger.plot_enabled=false", "logger.tensorboard_enabled=false", "logger.log_dir=runs",
            f"logger.run_name={run_name}"]


# --- the nemesis ----------------------------------------------------------------------------

@dataclass
class Injected:
    kind: str
    at_s: float
    """Since the first run started."""
    step: int
    """The last GRPO step logged when it landed."""
    pid: int
    hang_s: float = 0.0
    recovered_s: float | None = None
    """Fault -> the run logged step `step` + RECOVERED_AFTER (or finished)."""
    note: str = ""
    detected_s: float | None = None
    """A hang: SIGSTOP -> the run killed the stopped process (None: it did not, the hang ended first)."""
    replaced_s: float | None = None
    """A hang the run detected: SIGSTOP -> its replacement registered (services.json's new pid, a
    member_joined in coordinator.log)."""


@dataclass
class Outcome:
    run_dir: Path
    home: Path
    returncode: int
    launches: int
    wall_s: float
    faults: list[Injected] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    checkpoints: Path | None = None
    """Where the run's checkpoints are to check (None: <run>/checkpoints; a small disk's: a copy)."""


class Nemesis:
    """Runs `tandem run` in `work` and fires `faults` one after another (see the module's doc)."""

    def __init__(self, work: Path, steps: int, seed: int, faults: list[Fault], *, run_name: str = RUN_NAME,
                 timeout_s: float = 1800.0, recover_timeout_s: float = 300.0, log=print, overrides=(),
                 disk_mb: int | None = None):
        """overrides: more `tandem run` arguments (e.g. cluster.stopped_kill_s=5). disk_mb: the
        checkpoints go to a tmpfs of this size that only the run sees (benchmarks/chaos_sandbox.py),
        which DISK_FULL faults fill. With PARTITION faults the run gets a network of its own."""
        self.work, self.steps, self.seed, self.faults = work, steps, seed, faults
        self.run_dir, self.home = work / "runs" / run_name, work / "home"
        if not disk_mb and any(f.kind is FaultKind.DISK_FULL for f in faults):
            raise ValueError("disk_full faults need a small disk: Nemesis(disk_mb=...)")
        network = any(f.kind is FaultKind.PARTITION for f in faults)
        self.sandbox = Sandbox(work / "disk", disk_mb, network=network) if disk_mb or network else None
        self.disk = self.sandbox if disk_mb else None
        disk_args = [f"checkpointing.checkpoint_dir={self.disk.path / 'checkpoints'}"] if self.disk else []
        self.args = [*run_args(steps, seed, run_name), *disk_args, *overrides]
        self.timeout_s, self.recover_timeout_s, self._log = timeout_s, recover_timeout_s, log
        self.launches = 0
        self.proc: subprocess.Popen | None = None
        self._started = 0.0
        self._fault_log = work / "faults.jsonl"

    def _launch(self) -> None:
        self.launches += 1
        env = {**os.environ, "TANDEM_HOME": str(self.home), "OMP_NUM_THREADS": "1", "COLUMNS": "200",
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}  # this checkout
        env.pop("TANDEM_TOKEN", None)
        with open(self.work / f"console-{self.launches}.txt", "w") as out:
            prefix = self.sandbox.prefix(self.work) if self.sandbox else []  # the run sees its disk, its network
            self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "coordinator.cli.main", *self.args], cwd=self.work,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def console(self) -> str:
        return "".join((self.work / f"console-{i}.txt").read_text(errors="replace")
                       for i in range(1, self.launches + 1))

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _wait(self, condition, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None:
                raise RunExited(f"the run exited (rc {self.proc.returncode}) while waiting for {what}")
            if time.monotonic() > deadline or self._elapsed() > self.timeout_s:
                raise TimeoutError(f"no {what} within {timeout_s:.0f}s")
            time.sleep(0.1)

    def run(self) -> Outcome:
        self.work.mkdir(parents=True, exist_ok=True)
        self._fault_log.write_text("")
        if self.sandbox:
            self.sandbox.start()
        self._started = time.monotonic()
        self._launch()
        outcome = Outcome(self.run_dir, self.home, -1, 0, 0.0)
        try:
            for fault in (f for f in self.faults if f.startup):
                self._fire(fault, outcome)
            self._wait(lambda: last_step(self.run_dir) >= 1, "GRPO step 1", 900)
            for fault in (f for f in self.faults if not f.startup):
                if not self._fire(fault, outcome):
                    break
            remaining = self.timeout_s - self._elapsed()
            self.proc.wait(timeout=max(1.0, remaining))
        except RunExited as exc:
            self._log(str(exc))
        finally:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            outcome.returncode, outcome.launches, outcome.wall_s = self.proc.returncode, self.launches, self._elapsed()
            if self.disk:
                outcome.checkpoints = self.work / "checkpoints-at-end"
                self.disk.free()
                self.disk.copy_out("checkpoints", outcome.checkpoints)
            if self.sandbox:
                self.sandbox.close()
        return outcome

    def _fire(self, fault: Fault, outcome: Outcome) -> bool:
        """Wait fault.delay_s, inject it, wait until the run recovers; False once the run is too
        near its end for another fault."""
        deadline = time.monotonic() + fault.delay_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        step = last_step(self.run_dir)
        if step >= self.steps - RECOVERED_AFTER:
            return False
        pid, note = self._target(fault)
        launched = services(self.run_dir)
        if pid is None:
            outcome.skipped.append(f"{fault.kind.value}: {note}")
            self._log(f"skipped {fault.kind.value}: {note}")
            return True
        injected = Injected(fault.kind.value, round(self._elapsed(), 2), step, pid, fault.hang_s, note=note)
        joined = joins(self.run_dir)
        rejoins = fault.kind in (FaultKind.GENERATOR_KILL, FaultKind.REWARD_KILL)
        started = time.monotonic()
        group = fault.kind in (FaultKind.GENERATOR_KILL, FaultKind.GENERATOR_HANG, FaultKind.REWARD_KILL,
                               FaultKind.REWARD_HANG, FaultKind.SLOW_GENERATOR)
        send = os.killpg if group else os.kill
        name = SERVICE_OF.get(fault.kind, fault.service)  # the service a hang, a slowdown, a partition hits
        if fault.kind is FaultKind.DISK_FULL:
            injected.note = f"{self.disk.fill() / 2**20:.1f} MB filled the disk"
            time.sleep(fault.hang_s)  # the checkpoints written meanwhile find it full
            self.disk.free()
        elif fault.kind is FaultKind.PARTITION:
            partition = Partition(self.sandbox, pid)
            cut = partition.start()
            time.sleep(fault.hang_s)
            partition.stop()
            injected.note = f"{name} cut off ({cut} drop rules at first, {len(partition.rules)} at the end)"
        elif fault.kind is FaultKind.SLOW_GENERATOR:
            cycles = slow_down(pid, fault.hang_s)
            injected.note = (f"{cycles} cycles of {SLOW_STOP_S:g} s stopped, {SLOW_RUN_S:g} s running" if cycles is not None
                             else "DECLARED DEAD: killed by the run while slow")
        else:
            try:
                send(pid, signal.SIGSTOP if fault.kind.hang else signal.SIGKILL)
            except ProcessLookupError:
                outcome.skipped.append(f"{fault.kind.value}: pid {pid} was gone")
                return True
        if fault.kind.hang:
            injected.detected_s = hold_stopped(pid, fault.hang_s, started)
            try:
                send(pid, signal.SIGCONT)
            except ProcessLookupError:  # the run found it stopped too long (cluster.stopped_kill_s) and killed it
                injected.note = f"{note} killed while stopped, replaced".strip()
        if fault.kind is FaultKind.COORDINATOR_KILL:
            self.proc.wait(timeout=30)
            self._launch()  # the same command again, as a user would

        def recovered() -> bool:
            if (injected.detected_s is not None and injected.replaced_s is None and joins(self.run_dir) > joined
                    and replaced(launched, services(self.run_dir), name)):
                injected.replaced_s = round(time.monotonic() - started, 2)
            return ((last_step(self.run_dir) >= step + RECOVERED_AFTER and (not rejoins or joins(self.run_dir) > joined)
                     and (injected.detected_s is None or injected.replaced_s is not None)) or self.proc.poll() == 0)

        try:
            self._wait(recovered, f"a GRPO step after {fault.kind.value}", self.recover_timeout_s)
        except (TimeoutError, RunExited) as exc:
            injected.note = f"{note} NOT RECOVERED: {exc}".strip()
            self._record(injected, outcome)
            raise RunExited(injected.note) from exc
        injected.recovered_s = round(time.monotonic() - started, 2)
        if replaced(launched, services(self.run_dir), name) and "replaced" not in injected.note:
            if fault.kind.hang:
                injected.note = f"{note} stopped past cluster.stopped_kill_s, replaced".strip()
            elif fault.kind is FaultKind.SLOW_GENERATOR and "DECLARED DEAD" not in injected.note:
                injected.note += "; DECLARED DEAD: replaced"
            elif fault.kind is FaultKind.PARTITION:
                injected.note += ", replaced"
        self._record(injected, outcome)
        return True

    def _record(self, injected: Injected, outcome: Outcome) -> None:
        outcome.faults.append(injected)
        with open(self._fault_log, "a") as f:
            f.write(json.dumps(asdict(injected)) + "\n")
        self._log(f"[{injected.at_s:7.1f}s] {injected.kind:17s} after step {injected.step:3d} pid {injected.pid}"
                  f"{f' for {injected.hang_s:.1f}s' if injected.hang_s else ''}: recovered in "
                  f"{injected.recovered_s}s {injected.note}"
                  + (f" (killed {injected.detected_s}s after the SIGSTOP, replacement registered at "
                     f"{injected.replaced_s}s)" if injected.detected_s is not None else ""))

    def _target(self, fault: Fault) -> tuple[int | None, str]:
        pids = services(self.run_dir)
        kind = fault.kind
        if kind in (FaultKind.COORDINATOR_KILL, FaultKind.COORDINATOR_HANG):
            return self.proc.pid, ""
        if kind is FaultKind.DISK_FULL:
            return self.disk.pid, ""
        name = fault.service if kind is FaultKind.PARTITION else SERVICE_OF.get(kind, "trainer")
        pid = pids.get(name)
        if pid is None:
            return None, f"no {name} in services.json"
        if kind in (FaultKind.RANK_KILL, FaultKind.RANK_HANG):
            rank = torchrun_rank(pid, fault.rank)
            return rank, f"rank {fault.rank}" if rank else f"torchrun {pid} has no rank {fault.rank} now"
        return pid, ""


class RunExited(Exception):
    pass


def reference(work: Path, steps: int, seed: int, timeout_s: float = 900.0) -> Outcome:
    """The same seed's run without faults."""
    return Nemesis(work, steps, seed, [], timeout_s=timeout_s).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps of the run")
    parser.add_argument("--faults", type=int, default=20, help="at most this many faults (fewer if the run ends)")
    parser.add_argument("--rate", type=float, default=6.0, help="faults per minute of run (mean)")
    parser.add_argument("--kinds", default=",".join(k.value for k in FaultKind))
    parser.add_argument("--disk-mb", type=int, default=64,
                        help="with disk_full among the kinds: the size of the run's checkpoint disk (a tmpfs)")
    parser.add_argument("--max-hang-s", type=float, default=8.0, help="hangs last 1 s to this long")
    parser.add_argument("--stopped-kill-s", type=float, default=5.0,
                        help="cluster.stopped_kill_s of the run with faults: a hang longer than this is replaced")
    parser.add_argument("--startup", default="", help="kinds of faults fired first, while the run starts "
                        "(comma-separated; each --startup-delay-s after the launch)")
    parser.add_argument("--startup-delay-s", type=float, default=10.0)
    parser.add_argument("--async", dest="asynchronous", action="store_true",
                        help="asynchronous GRPO (rollouts one step ahead); checked by check_async")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="the faulted run's wall-clock limit (a longer run is an error); raise it for runs "
                             "of 30 minutes or more")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="chaos-"))
    kinds = [FaultKind(k) for k in args.kinds.split(",")]
    if FaultKind.PARTITION in kinds and (why := network_available(work)):
        kinds.remove(FaultKind.PARTITION)
        print(f"without partition faults: {why}", flush=True)
    plan = [Fault(FaultKind(k), args.startup_delay_s, 2.0 if FaultKind(k).hang else 0.0, startup=True)
            for k in filter(None, args.startup.split(","))]
    plan += schedule(args.seed, args.faults, args.rate, kinds, max_hang_s=args.max_hang_s)
    print(f"work: {work}\nschedule: {[(f.kind.value, f.delay_s, f.hang_s) for f in plan]}", flush=True)
    ref_dir = work / "reference" / "runs" / RUN_NAME
    if args.asynchronous:  # compared with no run: what it trained is timing-dependent (see check_async)
        ref_wall = 0.0
    elif (ref_dir / "summary.json").is_file():  # --work of an earlier call with the same seed and steps
        ref_wall = json.loads((ref_dir / "summary.json").read_text()).get("wall_time_s", 0.0)  # the run's own
        print(f"fault-free run: reusing {ref_dir}", flush=True)
    else:
        ref = reference(work / "reference", args.steps, args.seed)
        assert ref.returncode == 0, f"the fault-free run failed: {work / 'reference'}"
        ref_wall = ref.wall_s
        print(f"fault-free run: {ref.wall_s:.0f}s", flush=True)
    shutil.rmtree(work / "chaos", ignore_errors=True)
    disk_mb = args.disk_mb if any(f.kind is FaultKind.DISK_FULL for f in plan) else None
    try:
        outcome = Nemesis(work / "chaos", args.steps, args.seed, plan, log=lambda s: print(s, flush=True),
                          overrides=[f"cluster.stopped_kill_s={args.stopped_kill_s}",
                                     *(ASYNC_ARGS if args.asynchronous else [])], disk_mb=disk_mb,
                          timeout_s=args.timeout_s).run()
    except BaseException:
        stop_everything(work / "chaos" / "home")
        raise
    verdict = (check_async(outcome.run_dir, outcome.home, steps=args.steps, groups=PROMPTS, generations=GENERATIONS,
                           max_age=1, checkpoints=outcome.checkpoints, faults=outcome.faults)
               if args.asynchronous else check(ref_dir, outcome.run_dir, outcome.home, checkpoints=outcome.checkpoints,
                                               faults=outcome.faults))
    result = figures(outcome, verdict, args.seed, args.steps, args.rate)
    stop_everything(outcome.home)  # after a failed run
    result["reference_wall_s"] = round(ref_wall, 1)
    result["asynchronous"] = args.asynchronous
    if args.asynchronous:
        result["ledger"] = ledger_figures(outcome.run_dir)
    result["command"] = "benchmarks/chaos.py " + " ".join(without_paths(sys.argv[1:], ("--work", "--out")))
    args.out.mkdir(parents=True, exist_ok=True)
    mode = "-async" if args.asynchronous else ""
    stem = args.out / f"{time.strftime('%Y-%m-%d')}-chaos{mode}-seed{args.seed}-{args.steps}steps"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"figures: {stem}.json, {stem}.md")
    return 0 if verdict.passed and outcome.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
