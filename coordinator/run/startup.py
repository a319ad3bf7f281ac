"""What a run waits for while its services start, said in words for the progress display:
"trainer 1/1, generators 1/2, rewards 0/1 (waiting: arithmetic)"."""

from __future__ import annotations

from coordinator.cluster.registry import Member
from coordinator.config import ExperimentConfig
from tandem.kinds import ServiceKind


def expected_services(cfg: ExperimentConfig) -> tuple[int, list[str]]:
    """(generators, reward tasks) the run waits for beside its trainer."""
    plan = cfg.service_plan
    return plan.generators, sorted(plan.reward_tasks)


def describe_startup(cfg: ExperimentConfig, members: list[Member], trainer: bool = True) -> str:
    generators, tasks = expected_services(cfg)
    kinds = [m.kind for m in members]
    parts = [f"trainer {min(kinds.count(ServiceKind.TRAINER), 1)}/1"] if trainer else []
    if generators:
        parts.append(f"generators {min(kinds.count(ServiceKind.GENERATOR), generators)}/{generators}")
    if tasks:
        served = {t for m in members if m.kind is ServiceKind.REWARD for t in m.tasks}
        missing = [t for t in tasks if t not in served]
        parts.append(f"rewards {len(tasks) - len(missing)}/{len(tasks)}"
                     + (f" (waiting: {', '.join(missing)})" if missing else ""))
    return ", ".join(parts)
