"""The `ppo.*` section: PPO with a critic. Its presence makes the run a PPO run: the policy
(policy.*) samples through its generators exactly as in GRPO (grpo.* sets the prompts, samples
per prompt, steps and validation; each sample is its own episode, no group baseline), a critic
(ppo.critic.*: a value model trained by a second trainer service, its own torchrun) values every
sampled token, GAE turns the rewards and values into per-token advantages and returns
(coordinator/loop/gae.py), the policy trains with loss_fn's clipped loss on those advantages and
the critic with the clipped value loss on the returns (trainer_svc/losses/value.py).

NeMo-RL has no PPO; the keys are verl's where it has them (algorithm.gamma / algorithm.lam as
ppo.gamma / ppo.lam, critic.cliprange_value, critic.model.path as ppo.critic.model_name) and
NeMo-RL's policy.* names for the critic's own trainer settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from coordinator.config.policy import OptimizerConfig
from coordinator.config.section import Section
from trainer_svc.config import DTensorSettings, OptimizerSettings
from trainer_svc.types import ValueLossConfig


class CriticConfig(ValueLossConfig):
    """ppo.critic: the value model and its trainer service (DTensor backend), and the value loss's
    key (cliprange_value)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model_name: str | None = None
    """HF checkpoint directory of the critic's body (a causal LM: its transformer gets a fresh value
    head, zero at start; or a critic exported before, head included); null: the policy's checkpoint
    (policy.model_name, or the embedded tiny model)."""
    num_ranks: int = Field(1, ge=1)
    """torchrun ranks of the critic's trainer service (FSDP over them)."""
    precision: Literal["float32", "bfloat16"] | None = None
    """Compute dtype of the critic; null: policy.precision."""
    optimizer: OptimizerConfig = OptimizerConfig(kwargs=OptimizerSettings(lr=1e-3))
    """The critic's optimizer (AdamW) and its own learning rate (a fresh head learns faster than the
    policy's lr allows)."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the critic's global gradient norm to this; null: no clipping."""
    dtensor_cfg: DTensorSettings = DTensorSettings()
    """The critic's DTensor/FSDP2 settings (tensor parallel, LoRA and context parallel not yet)."""
    train_global_batch_size: int | None = Field(None, gt=0)
    """Samples per critic optimizer step; null: policy.train_global_batch_size."""
    train_micro_batch_size: int | None = Field(None, gt=0)
    """Samples per critic forward/backward on one rank; null: policy.train_micro_batch_size."""
    value_batch_size: int | None = Field(None, gt=0)
    """Samples per value forward on one rank; null: policy.logprob_batch_size."""

    @field_validator("model_name")
    @classmethod
    def _model_dir_given(cls, value: str | None) -> str | None:
        from pathlib import Path

        if value is not None and not (Path(value) / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face checkpoint directory (no config.json); give the "
                             "critic's checkpoint directory or leave ppo.critic.model_name unset (the policy's)")
        return value

    @model_validator(mode="after")
    def _dtensor_only(self) -> CriticConfig:
        dtensor = self.dtensor_cfg
        if not dtensor.enabled or dtensor.tensor_parallel_size > 1 or dtensor.lora_cfg.enabled:
            raise ValueError("ppo.critic trains on the DTensor backend without tensor parallel or LoRA for now: set "
                             "ppo.critic.dtensor_cfg.enabled=true, tensor_parallel_size=1, lora_cfg.enabled=false")
        return self

    def trainer_loss(self) -> ValueLossConfig:
        """The critic's loss: these keys' ValueLossConfig fields."""
        return ValueLossConfig(**self.model_dump(include=set(ValueLossConfig.model_fields)))


class PPOConfig(Section):
    """ppo.*: GAE's discount and lambda, advantage whitening and the critic (ppo.critic.*, required)."""

    gamma: float = Field(1.0, ge=0, le=1)
    """Discount per token in GAE (verl's algorithm.gamma); 1: the completion's reward undiscounted."""
    lam: float = Field(0.95, ge=0, le=1)
    """GAE's lambda (verl's algorithm.lam): 1 is the reward-to-go minus the value (Monte Carlo), 0 the
    one-step TD error."""
    normalize_advantages: bool = True
    """Whiten the advantages over the batch's trained tokens (zero mean, unit variance)."""
    critic: CriticConfig | None = None
    """The critic (required: `ppo: {critic: {}}` takes every default)."""

    @model_validator(mode="after")
    def _needs_a_critic(self) -> PPOConfig:
        if self.critic is None:
            raise ValueError("ppo needs a critic: add a ppo.critic section (ppo.critic: {} takes the policy's "
                             "checkpoint and the defaults; ppo.critic.optimizer.kwargs.lr sets its learning rate)")
        return self
