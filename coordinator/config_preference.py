"""The preference algorithms' config sections (NeMo-RL's `dpo.*`, `rm.*` and
`policy.reward_model_cfg.*` keys) and the run's algorithm, resolved once at load.

A config with a `dpo:` section runs DPO, one with an `rm:` section trains a reward model, and
any other runs the rollout loop (SFT warm start and/or GRPO/DAPO). DPO and RM train on
preference pairs (`data.*`: prompt, chosen, rejected) and launch only the trainer. Their
`policy.train_global_batch_size` / `train_micro_batch_size` count pairs (the trainer gets twice
as many samples), as in NeMo-RL.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainer_svc.types import DpoLossConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Algorithm(str, Enum):
    """What a run does, resolved from its sections (nothing downstream re-reads them)."""

    GRPO = "grpo"
    """The rollout loop: SFT warm start (sft.*) then GRPO/DAPO (grpo.*); generators and rewards."""
    DPO = "dpo"
    """Direct preference optimisation on pairs (dpo.*); the trainer only."""
    RM = "rm"
    """Bradley-Terry reward-model training on pairs (rm.*); the trainer only."""

    @property
    def uses_rollouts(self) -> bool:
        """Whether the run needs generators and reward services."""
        return self is Algorithm.GRPO


class RewardModelCfg(_Section):
    """policy.reward_model_cfg: the policy is a scalar-head reward model (needed by rm.*)."""

    enabled: bool = False
    """Load policy.model_name as a one-output sequence classifier (a causal LM gets a new score head)."""
    reward_model_type: Literal["bradley_terry"] = "bradley_terry"


class DPOConfig(_Section):
    """dpo.*: the loop and NeMo-RL's DPO loss keys."""

    max_num_steps: int = Field(100, ge=1)
    """Optimizer steps of policy.train_global_batch_size pairs."""
    max_num_epochs: int = Field(1, ge=1)
    """Stop earlier once this many passes over the training pairs are done."""
    val_period: int = Field(10, ge=0)
    """Held-out reward accuracy every this many steps (0: only at the start and the end)."""
    val_at_start: bool = True
    max_val_samples: int = Field(256, gt=0)
    """Held-out pairs scored at each validation."""
    seed: int = 42
    """Seed of the order in which training pairs are drawn."""
    reference_policy_kl_penalty: float = Field(0.05, gt=0)
    """beta of the DPO loss."""
    preference_loss_weight: float = Field(1.0, ge=0)
    sft_loss_weight: float = Field(0.0, ge=0)
    """Weight of the NLL of the chosen responses; 0: none."""
    preference_average_log_probs: bool = False
    """Average each response's token log-ratios instead of summing them."""
    sft_average_log_probs: bool = False
    """Average each chosen response's token NLL instead of summing it."""

    @model_validator(mode="after")
    def _valid_loss(self) -> DPOConfig:
        self.trainer_loss()  # raises ValueError naming the keys
        return self

    def trainer_loss(self) -> DpoLossConfig:
        """The trainer's loss for these keys (raises ValueError on an invalid combination)."""
        return DpoLossConfig(**self.model_dump(include=set(DpoLossConfig.__dataclass_fields__)))


class RMConfig(_Section):
    """rm.*: Bradley-Terry reward-model training."""

    max_num_steps: int = Field(100, ge=1)
    """Optimizer steps of policy.train_global_batch_size pairs."""
    max_num_epochs: int = Field(1, ge=1)
    """Stop earlier once this many passes over the training pairs are done."""
    seed: int = 42
    """Seed of the order in which training pairs are drawn."""


def resolve_algorithm(dpo: DPOConfig | None, rm: RMConfig | None, reward_model: RewardModelCfg,
                      dataset_name: str) -> Algorithm:
    """The run's algorithm from its sections; ValueError naming the keys to change."""
    if dpo is not None and rm is not None:
        raise ValueError("a config holds a dpo section or an rm section, not both: remove one")
    algorithm = Algorithm.DPO if dpo is not None else Algorithm.RM if rm is not None else Algorithm.GRPO
    if reward_model.enabled != (algorithm is Algorithm.RM):
        raise ValueError("policy.reward_model_cfg.enabled must be true exactly when the config has an rm section "
                         "(reward-model training): set both or neither")
    preference_data = dataset_name in ("arithmetic_preference", "jsonl")
    if not algorithm.uses_rollouts and not preference_data:
        raise ValueError(f"{algorithm.value} trains on preference pairs: set data.dataset_name to "
                         "arithmetic_preference (the embedded toy pairs) or jsonl (prompt/chosen/rejected rows)")
    if algorithm.uses_rollouts and dataset_name == "arithmetic_preference":
        raise ValueError("data.dataset_name arithmetic_preference holds preference pairs, for a dpo or rm run; "
                         "use arithmetic or jsonl for GRPO/SFT")
    return algorithm
