"""Settings of the trainer service (`--settings trainer.json`), validated once at start.

Field names follow NeMo-RL's `policy.*` keys where one exists (`model_name`,
`max_grad_norm`, `optimizer`, `dtensor_cfg.*`, `megatron_cfg.*`). Unknown keys are errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainer_svc.backends.megatron.settings import MegatronSettings  # pydantic only: no torch, no megatron


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class OptimizerSettings(_Strict):
    """AdamW hyperparameters (no schedule: the learning rate is constant)."""

    lr: float = Field(5e-6, gt=0)
    """Learning rate."""
    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam beta1, beta2."""
    eps: float = Field(1e-8, gt=0)
    """Adam epsilon."""


class DTensorSettings(_Strict):
    """The DTensor/FSDP2 backend: every decoder layer and the root are `fully_shard`ed over
    all ranks (1-D mesh)."""

    enabled: bool = True
    """Use this backend (megatron_cfg.enabled wins when both are set)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (non-reentrant)."""


class TrainerSettings(_Strict):
    """Everything the trainer needs; the token comes from the environment, never from here."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), use_attribute_docstrings=True)

    model_name: str
    """Hugging Face checkpoint directory of the initial policy (also the reference policy)."""
    seed: int = 42
    """Seed of torch's RNG on every rank."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype. Parameters, gradients and optimizer state stay float32; bfloat16 runs
    forward/backward in bfloat16 with float32 gradient reduction."""
    optimizer: OptimizerSettings = OptimizerSettings()
    """AdamW settings."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; None disables clipping (the norm is still reported)."""
    dtensor_cfg: DTensorSettings = DTensorSettings()
    """DTensor/FSDP2 backend settings."""
    megatron_cfg: MegatronSettings = MegatronSettings()
    """Megatron-core backend settings (NeMo-RL's `policy.megatron_cfg`)."""
    weight_sync_host: str = "127.0.0.1"
    """Interface the weight-sync TCPStore (on rank 0) binds and advertises."""
    weight_sync_bucket_bytes: int = Field(256 << 20, gt=0)
    """Bytes per weight-sync bucket (one broadcast each)."""
    weight_sync_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """dtype the generators receive; auto: the checkpoint's own dtype (config.json)."""
    lockstep_timeout_s: float = Field(7 * 24 * 3600, gt=0)
    """How long ranks other than 0 wait for the next command (time between RPCs)."""

    @model_validator(mode="after")
    def _backend_chosen(self) -> TrainerSettings:
        if not (self.dtensor_cfg.enabled or self.megatron_cfg.enabled):
            raise ValueError("no training backend enabled: set dtensor_cfg.enabled=true or megatron_cfg.enabled=true")
        return self

    @property
    def backend(self) -> Literal["dtensor", "megatron"]:
        """Megatron when megatron_cfg.enabled (NeMo-RL's precedence), else DTensor."""
        return "megatron" if self.megatron_cfg.enabled else "dtensor"


def load_settings(path: str | Path) -> TrainerSettings:
    """Read and validate a settings JSON file; a pydantic ValidationError names the bad key."""
    return TrainerSettings.model_validate_json(Path(path).read_text())
