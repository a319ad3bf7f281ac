"""Which samples each GRPO step trained on: one compact record per step, always kept (the run
writes them to <run>/ledger.jsonl, coordinator/run/grpo_run.py).

A sample's id is (draw, generation, version): `draw` is its prompt's index in the run's stream
of drawn prompts (PromptCursor.drawn: a resumed run draws the same indices again from its
checkpoint's cursor), `generation` its index among the prompt's n samples, `version` the weight
version that sampled it. A record holds the groups the step trained (each its draw and its
samples' versions, in generation order), the trainer's weight version when the step took them
(a trained sample's age is that minus its version), and the groups drawn for the step that it
did not train, each with its reason (`DropReason`). `account` checks a run's records (as
benchmarks/chaos_check.py does after a run with faults): nothing trained twice, nothing lost,
every step a full batch within the age bound.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class DropReason(enum.Enum):
    STALE = "stale"
    """Older than the age bound when its step took it; its prompt was sampled again (pipeline.py)."""
    ZERO_VARIANCE = "zero_variance"
    """Dynamic sampling: its rewards all agreed."""
    SURPLUS = "surplus"
    """Dynamic sampling: the step had its groups already."""


@dataclass(frozen=True)
class GroupIds:
    draw: int
    versions: tuple[int, ...]
    """The weight version of each of its samples, in generation order."""

    def to_json(self) -> list:
        return [self.draw, list(self.versions)]


@dataclass(frozen=True)
class Dropped:
    group: GroupIds
    reason: DropReason

    def to_json(self) -> list:
        return [*self.group.to_json(), self.reason.value]


@dataclass(frozen=True)
class StepSamples:
    step: int
    trainer_version: int
    trained: tuple[GroupIds, ...]
    dropped: tuple[Dropped, ...] = ()

    def to_json(self) -> dict:
        """{"step", "trainer_version", "trained": [[draw, [versions]]], "dropped": [[draw, [versions], reason]]}"""
        return {"step": self.step, "trainer_version": self.trainer_version,
                "trained": [g.to_json() for g in self.trained], "dropped": [d.to_json() for d in self.dropped]}

    @staticmethod
    def from_json(row: dict) -> StepSamples:
        return StepSamples(int(row["step"]), int(row["trainer_version"]),
                           tuple(GroupIds(int(d), tuple(map(int, v))) for d, v in row["trained"]),
                           tuple(Dropped(GroupIds(int(d), tuple(map(int, v))), DropReason(r))
                                 for d, v, r in row.get("dropped", ())))


def account(records: Sequence[StepSamples], *, steps: int, groups: int, generations: int, max_age: int) -> list[str]:
    """Every sample of a run accounted for, from its records (the run's final history, in order).
    Returns the problems; none means nothing lost, nothing twice:

    - every step 1..steps has one record, in order;
    - each trained a full batch (`groups` groups of `generations` samples), every sample at most
      `max_age` versions older than the trainer's weights when its step took it;
    - no (draw, generation) trained twice (a prompt sampled again after a stale drop has a new
      version: the id dropped and the id trained differ, the (draw, generation) is trained once);
    - none lost: the draws seen, trained or dropped, are exactly 0..the last one (every prompt
      the cursor drew was trained, or dropped with a reason), and a drop for staleness names a
      sample older than the bound."""
    problems: list[str] = []
    logged = [r.step for r in records]
    if logged != list(range(1, steps + 1)):
        twice = sorted({s for s in logged if logged.count(s) > 1})
        missing = sorted(set(range(1, steps + 1)) - set(logged))
        problems.append(f"steps recorded twice {twice}, missing {missing}" if twice or missing
                        else f"steps recorded out of order: {logged}")
    trained_at: dict[tuple[int, int], int] = {}
    seen: set[int] = set()
    for record in records:
        step, version = record.step, record.trainer_version
        size = sum(len(g.versions) for g in record.trained)
        if len(record.trained) != groups or any(len(g.versions) != generations for g in record.trained):
            problems.append(f"step {step}: trained {size} samples in {len(record.trained)} groups, "
                            f"not {groups * generations} in {groups}")
        for group in record.trained:
            seen.add(group.draw)
            if group.versions and version - min(group.versions) > max_age:
                problems.append(f"step {step}: draw {group.draw} trained {version - min(group.versions)} versions "
                                f"old (bound {max_age})")
            for g in range(len(group.versions)):
                if (group.draw, g) in trained_at:
                    problems.append(f"sample (draw {group.draw}, generation {g}) trained twice: steps "
                                    f"{trained_at[group.draw, g]} and {step}")
                trained_at[group.draw, g] = step
        for dropped in record.dropped:
            seen.add(dropped.group.draw)
            versions = dropped.group.versions
            if dropped.reason is DropReason.STALE and versions and version - min(versions) <= max_age:
                problems.append(f"step {step}: draw {dropped.group.draw} dropped as stale at age "
                                f"{version - min(versions)} (bound {max_age})")
    lost = sorted(set(range(max(seen, default=-1) + 1)) - seen)
    if lost:
        problems.append(f"draws lost (neither trained nor dropped): {lost[:20]}{' ...' if len(lost) > 20 else ''}")
    return problems
