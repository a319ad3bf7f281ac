"""Training backends behind `trainer_svc.interfaces.TrainerBackend`; `build_backend` picks one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # trainer_svc.config imports the Megatron settings from this package
    from trainer_svc.config import TrainerSettings
    from trainer_svc.distributed import DistEnv
    from trainer_svc.interfaces import TrainerBackend


def build_backend(settings: TrainerSettings, env: DistEnv) -> TrainerBackend:
    """The backend the settings choose (Megatron when megatron_cfg.enabled, else DTensor)."""
    if settings.backend == "megatron":
        from trainer_svc.backends.megatron.backend import MegatronBackend

        return MegatronBackend(settings, env)
    from trainer_svc.backends.dtensor import DTensorBackend

    return DTensorBackend(settings, env)
