"""Sharded checkpoints of the DTensor backend: DCP for model + optimizer, one RNG file per rank.

Layout of a checkpoint directory (written by all ranks; the directory must be shared):
    dcp/                 torch.distributed.checkpoint shards (`.metadata`, `__<rank>_0.distcp`)
    rng/rank<R>.pt       torch RNG states of rank R (CPU and, on GPUs, CUDA)
    trainer_state.json   {"global_step": ..., "world_size": ...} (rank 0)
DCP reshards on load, so a checkpoint loads under another world size (RNG then stays as is).
`trained_only` (LoRA) leaves the frozen parameters out: the checkpoint holds the adapters and
their optimizer state, and loading restores those over the base weights loaded at start.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

STATE_FILE = "trainer_state.json"


def _options(trained_only: bool) -> StateDictOptions:
    return StateDictOptions(ignore_frozen_params=trained_only, strict=not trained_only)


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int,
                    world_size: int, global_step: int, trained_only: bool = False) -> None:
    (path / "rng").mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=_options(trained_only))
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path / "dcp"))
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, path / "rng" / f"rank{rank}.pt")
    if rank == 0:
        tmp = path / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps({"global_step": global_step, "world_size": world_size}))
        tmp.replace(path / STATE_FILE)


def is_checkpoint(path: Path) -> bool:
    return (path / STATE_FILE).is_file() and (path / "dcp" / ".metadata").is_file()


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int,
                    trained_only: bool = False) -> int:
    """Restore model, optimizer and this rank's RNG; returns the saved global step."""
    options = _options(trained_only)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    rng_file = path / "rng" / f"rank{rank}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return int(json.loads((path / STATE_FILE).read_text())["global_step"])
