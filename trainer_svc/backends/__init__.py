"""Training backends behind `trainer_svc.interfaces.TrainerBackend`; `build_backend` picks one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer_svc.config import TrainerSettings, TrainingBackend

if TYPE_CHECKING:
    from trainer_svc.distributed import DistEnv
    from trainer_svc.interfaces import TrainerBackend


def build_backend(settings: TrainerSettings, env: DistEnv) -> TrainerBackend:
    """The backend the settings resolved at load (trainer_svc.config.resolve_backend)."""
    if settings.backend is TrainingBackend.MEGATRON:
        from trainer_svc.backends.megatron.backend import MegatronBackend

        return MegatronBackend(settings, env)
    from trainer_svc.backends.dtensor import DTensorBackend

    return DTensorBackend(settings, env)
