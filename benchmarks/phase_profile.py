"""Where a run's CPU went, phase by phase: a system-wide `perf` profile cut by the run's own
train and publish boundaries (benchmarks/results/2026-12-02-fresh-pages.md).

    perf record -a -F 99 -g --clockid realtime -o D/perf.data &   # beside the run, then stop it
    THP_MEM_ALLOC_ENABLE=1 PYTHONPATH=. .venv/bin/python benchmarks/real_size.py --systems tandem --reps 1 --no-resume --work-dir D
    perf script -i D/perf.data -F comm,pid,time,ip,sym,dso > D/perf.txt
    python benchmarks/phase_profile.py D/tandem-0/run D/perf.txt [--by-object 6]

For each train phase (the trainer's `train_step` event, back by metrics.jsonl's `time_train_s`)
and each publish (the coordinator's `weights_published` event, back by its `seconds`) it prints
the CPU-seconds sampled in it, summed over every process but the idle task, and how many of them
the kernel spent zeroing fresh pages (`clear_page*` on top of the stack). `--by-object N` adds,
per phase, the N (process, shared object on top of the stack) pairs that took the most CPU, e.g.
libgomp.so.1 for OpenMP threads spinning between parallel regions
(benchmarks/results/2026-12-03-receive-threads.md). `--clockid realtime` is what lets perf's
timestamps meet the logs' wall-clock ones.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Phase:
    kind: str  # "train" or "publish"
    start: float  # seconds since the epoch
    end: float


@dataclass(frozen=True)
class Sample:
    comm: str
    time: float
    top: str  # the innermost frame's symbol line

    @property
    def object(self) -> str:
        """The innermost frame's shared object (its file name; perf-PID.map for JIT code), or ""
        when perf script was not asked for `dso`."""
        if not self.top.endswith(")"):
            return ""
        return self.top.rsplit("(", 1)[-1].rstrip(")").rsplit("/", 1)[-1]


def _epoch(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp).timestamp()


def _events(path: Path, event: str) -> list[dict]:
    return [record for line in path.read_text().splitlines()
            if f'"{event}"' in line and (record := json.loads(line)).get("event") == event]


def run_phases(run_dir: Path) -> list[Phase]:
    """The run's train phases and publishes, in the order they happened."""
    durations = [m["time_train_s"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                 if "time_train_s" in m]
    ends = [_epoch(e["timestamp"]) for e in _events(run_dir / "logs" / "trainer.log", "train_step")]
    phases = [Phase("train", end - seconds, end) for seconds, end in zip(durations, ends)]
    for published in _events(run_dir / "logs" / "coordinator.log", "weights_published"):
        end = _epoch(published["timestamp"])
        phases.append(Phase("publish", end - published["seconds"], end))
    return sorted(phases, key=lambda p: p.start)


def parse_perf_script(lines: Iterable[str]) -> Iterator[Sample]:
    """Samples of `perf script -F comm,pid,time,ip,sym[,dso]` output: a header line per sample
    (comm, pid, time followed by a colon), then its stack, innermost frame first, then a blank line."""
    header: tuple[str, float] | None = None
    for line in lines:
        text = line.strip()
        if not text:
            header = None
        elif header is None:
            fields = text.split()
            header = (fields[0], float(fields[-1].rstrip(":")))
            top_pending = True
        elif top_pending:
            top_pending = False
            yield Sample(header[0], header[1], text)


def _busy_in_phases(phases: list[Phase], samples: Iterable[Sample]) -> Iterator[tuple[int, Sample]]:
    """(phase index, sample) for each sample of a busy CPU (not the idle task) inside a phase."""
    for sample in samples:
        if sample.comm == "swapper":  # the idle task
            continue
        for i, phase in enumerate(phases):
            if phase.start <= sample.time <= phase.end:
                yield i, sample


def profile(phases: list[Phase], samples: Iterable[Sample], hz: float) -> list[tuple[Phase, float, float]]:
    """Per phase: (phase, CPU-seconds busy, CPU-seconds zeroing pages), at `hz` samples a second."""
    busy = [0] * len(phases)
    zeroing = [0] * len(phases)
    for i, sample in _busy_in_phases(phases, samples):
        busy[i] += 1
        zeroing[i] += "clear_page" in sample.top
    return [(phase, busy[i] / hz, zeroing[i] / hz) for i, phase in enumerate(phases)]


def by_object(phases: list[Phase], samples: Iterable[Sample], hz: float,
              top: int) -> list[tuple[Phase, list[tuple[str, str, float]]]]:
    """Per phase: its `top` (process name, shared object, CPU-seconds) triples, the most first."""
    counts: list[Counter[tuple[str, str]]] = [Counter() for _ in phases]
    for i, sample in _busy_in_phases(phases, samples):
        counts[i][(sample.comm, sample.object or "?")] += 1
    return [(phase, [(comm, obj, n / hz) for (comm, obj), n in counts[i].most_common(top)])
            for i, phase in enumerate(phases)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run's directory (logger.log_dir/logger.run_name)")
    parser.add_argument("perf_script", type=Path, help="`perf script -F comm,pid,time,ip,sym[,dso]` output (dso for --by-object)")
    parser.add_argument("--hz", type=float, default=99, help="perf record's -F")
    parser.add_argument("--by-object", type=int, default=0, metavar="N",
                        help="also, per phase, the N (process, shared object) pairs with the most CPU (needs dso)")
    args = parser.parse_args()
    phases = run_phases(args.run_dir)
    with args.perf_script.open() as lines:
        samples = list(parse_perf_script(lines))
    print("| phase | wall s | CPU busy s | zeroing fresh pages s |\n| --- | --- | --- | --- |")
    for phase, busy, zeroing in profile(phases, samples, args.hz):
        share = f" ({zeroing / busy:.0%})" if busy else ""
        print(f"| {phase.kind} | {phase.end - phase.start:.1f} | {busy:.1f} | {zeroing:.1f}{share} |")
    if args.by_object:
        for phase, rows in by_object(phases, samples, args.hz, args.by_object):
            print(f"\n{phase.kind}, {phase.end - phase.start:.2f} s: "
                  + ", ".join(f"{comm} {obj} {cpu:.2f}" for comm, obj, cpu in rows))


if __name__ == "__main__":
    main()
