"""Sharded checkpoints of the Megatron backend, in Megatron's own distributed format.

Layout of a checkpoint directory (written by all ranks; the directory must be shared):
    dist/                `megatron.core.dist_checkpointing` (torch_dist): model and optimizer
                         state as sharded tensors, reshardable to another TP/PP layout
    scheduler.pt         the LR/weight-decay scheduler's state (rank 0)
    rng/rank<R>.pt       torch RNG state of rank R and Megatron's tracker states
    trainer_state.json   {"global_step": ..., "world_size": ...} (rank 0, written last)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

STATE_FILE = "trainer_state.json"


# The distributed optimizer's state in the canonical per-parameter layout, so a checkpoint
# reshards to another TP/PP/DP layout (the default flattened format is refused by 0.16's
# own validation).
_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(ddp_model, optimizer, *, is_loading: bool) -> dict:
    model_state = ddp_model.module.sharded_state_dict()  # unwrapped: the names the model loads
    return {"model": model_state,
            "optimizer": optimizer.sharded_state_dict(model_state, is_loading=is_loading, metadata=_METADATA)}


def _inner_states(optimizer) -> list[dict]:
    """Per-parameter states of the torch optimizers inside Megatron's (chained) optimizer."""
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [state for opt in chained for state in opt.optimizer.state.values()]


def _adam_step(optimizer) -> float:
    states = [s["step"] for s in _inner_states(optimizer) if "step" in s]
    return float(states[0]) if states else 0.0


def _restore_adam_step(optimizer, step: float) -> None:
    """Megatron 0.16 restores the moments but not torch Adam's per-parameter `step` (it expects
    apex's FusedAdam, which keeps the step per group), so Adam's bias correction would restart."""
    for state in _inner_states(optimizer):
        if "step" in state:
            state["step"] = torch.full_like(state["step"], step) if torch.is_tensor(state["step"]) else step


def save_checkpoint(path: Path, ddp_model, optimizer, scheduler, *, rank: int, world_size: int,
                    global_step: int) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    (path / "rng").mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (path / "dist").mkdir(exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(ddp_model, optimizer, is_loading=False), str(path / "dist"))
    torch.save({"cpu": torch.get_rng_state(), "tracker": get_cuda_rng_tracker().get_states()},
               path / "rng" / f"rank{rank}.pt")
    if rank == 0:
        torch.save(scheduler.state_dict(), path / "scheduler.pt")
        tmp = path / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps({"global_step": global_step, "world_size": world_size, "backend": "megatron",
                                   "adam_step": _adam_step(optimizer)}))
        tmp.replace(path / STATE_FILE)


def is_checkpoint(path: Path) -> bool:
    return (path / STATE_FILE).is_file() and (path / "dist").is_dir() and (path / "scheduler.pt").is_file()


def load_checkpoint(path: Path, ddp_model, optimizer, scheduler, *, rank: int) -> int:
    """Restore model, optimizer, scheduler and this rank's RNG; returns the saved global step."""
    from megatron.core import dist_checkpointing
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    state = dist_checkpointing.load(_sharded_state(ddp_model, optimizer, is_loading=True), str(path / "dist"))
    with torch.no_grad():  # fp32 main params of the distributed optimizer are views of the model's leaves
        ddp_model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng_file = path / "rng" / f"rank{rank}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["cpu"])
        get_cuda_rng_tracker().set_states(rng["tracker"])
    saved = json.loads((path / STATE_FILE).read_text())
    _restore_adam_step(optimizer, saved["adam_step"])
    return int(saved["global_step"])
