"""Training backends behind `trainer_svc.interfaces.TrainerBackend`; `build_backend` picks one."""

from __future__ import annotations

from trainer_svc.config import TrainerSettings
from trainer_svc.distributed import DistEnv
from trainer_svc.interfaces import TrainerBackend


def build_backend(settings: TrainerSettings, env: DistEnv) -> TrainerBackend:
    """The backend the settings enable (validated at load: only DTensor exists)."""
    from trainer_svc.backends.dtensor import DTensorBackend

    return DTensorBackend(settings, env)
