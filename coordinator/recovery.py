"""Deciding how to recover (pure parts of coordinator/run.py's restarts): whether the trainer
is dead, and which weight version a resumed run publishes."""

from __future__ import annotations

from collections.abc import Iterable

import grpc


def trainer_dead(services, launcher) -> bool:
    """Whether the trainer is gone: its launched process exited, or it does not answer GetInfo
    (an error that left the trainer answering was not the trainer's death)."""
    if launcher.exited("trainer"):
        return True
    try:
        services.trainer.info()
    except (grpc.RpcError, RuntimeError):  # RuntimeError: no live trainer in the registry
        return True
    return False


def resume_version(checkpoint_version: int, served: Iterable[int]) -> int:
    """The version to publish a checkpoint's weights under: the checkpoint's own (so a resumed
    run repeats an uninterrupted one), unless something already serves or published a later
    version (generators that outlived the trainer or the coordinator refuse older versions):
    then the next version after it."""
    newest = max(served, default=checkpoint_version)
    return checkpoint_version if newest <= checkpoint_version else newest + 1
