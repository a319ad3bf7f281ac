"""Whether the trainer is dead (coordinator/run/grpo_run.py relaunches it then)."""

from __future__ import annotations

from tandem.rpc import RpcFailure


def trainer_dead(services, launcher) -> bool:
    """Whether the trainer is gone: its launched process exited, or it does not answer GetInfo
    (an error that left the trainer answering was not the trainer's death)."""
    if launcher.exited("trainer"):
        return True
    try:
        services.trainer.info()
    except (RpcFailure, RuntimeError):  # RuntimeError: no live trainer in the registry
        return True
    return False
