"""Whether the trainer is dead (coordinator/run/grpo_run.py relaunches it then)."""

from __future__ import annotations

from tandem.rpc import RpcFailure


def trainer_dead(services, launcher, error: BaseException | None = None, grace_s: float = 60.0) -> bool:
    """Whether the trainer is gone: its launched process exited, or it does not answer GetInfo
    (an error that left the trainer answering was not the trainer's death). A failed trainer
    call (`error`) while rank 0 still answers may be the death of another rank: its collective
    broke (e.g. gloo's "Connection reset by peer") and torchrun is tearing the rest down, so the
    trainer counts as dead if its process exits within grace_s."""
    if launcher.exited("trainer"):
        return True
    try:
        services.trainer.info()
    except (RpcFailure, RuntimeError):  # RuntimeError: no live trainer in the registry
        return True
    if isinstance(error, RpcFailure) and not error.status.rejects_request:
        return launcher.wait_exit("trainer", grace_s) is not None
    return False
