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

from pydantic import ConfigDict, Field

from coordinator.config.data import DatasetName
from coordinator.config.section import Section
from trainer_svc.config import RewardModelTrainingSettings
from trainer_svc.types import DpoLossConfig


class Algorithm(str, Enum):
    """What a run does, resolved from its sections (nothing downstream re-reads them)."""

    GRPO = "grpo"
    """The rollout loop: SFT warm start (sft.*) then GRPO/DAPO (grpo.*); generators and rewards."""
    DPO = "dpo"
    """Direct preference optimisation on pairs (dpo.*); the trainer only."""
    RM = "rm"
    """Bradley-Terry reward-model training on pairs (rm.*); the trainer only."""
    DISTILLATION = "distillation"
    """On-policy distillation (distillation.*): the rollout loop, with a teacher scoring the samples."""
    PPO = "ppo"
    """PPO with a critic (ppo.*): the rollout loop, a critic service valuing the samples, GAE advantages."""

    @property
    def uses_rollouts(self) -> bool:
        """Whether the run needs generators and reward services."""
        return self in (Algorithm.GRPO, Algorithm.DISTILLATION, Algorithm.PPO)


class DPOConfig(DpoLossConfig):
    """dpo.*: the loop's keys, and NeMo-RL's DPO loss keys (trainer_svc.types.DpoLossConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_num_steps: int = Field(100, ge=1)
    """Optimizer steps of policy.train_global_batch_size pairs."""
    max_num_epochs: int = Field(1, ge=1)
    """Stop earlier once this many passes over the training pairs are done."""
    val_period: int = Field(10, ge=0)
    """Held-out reward accuracy every this many steps (0: only at the start and the end)."""
    val_at_start: bool = True
    """Validate before the first step."""
    max_val_samples: int = Field(256, gt=0)
    """Held-out pairs scored at each validation."""
    seed: int = 42
    """Seed of the order in which training pairs are drawn."""

    def trainer_loss(self) -> DpoLossConfig:
        """The trainer's loss: these keys' DpoLossConfig fields."""
        return DpoLossConfig(**self.model_dump(include=set(DpoLossConfig.model_fields)))


class RMConfig(Section):
    """rm.*: Bradley-Terry reward-model training."""

    max_num_steps: int = Field(100, ge=1)
    """Optimizer steps of policy.train_global_batch_size pairs."""
    max_num_epochs: int = Field(1, ge=1)
    """Stop earlier once this many passes over the training pairs are done."""
    seed: int = 42
    """Seed of the order in which training pairs are drawn."""


def resolve_algorithm(dpo: DPOConfig | None, rm: RMConfig | None, reward_model: RewardModelTrainingSettings,
                      dataset_name: DatasetName, *, distillation: bool = False, ppo: bool = False) -> Algorithm:
    """The run's algorithm from its sections; ValueError naming the keys to change."""
    if sum((dpo is not None, rm is not None, distillation, ppo)) > 1:
        raise ValueError("a config holds at most one of the dpo, rm, distillation and ppo sections: remove the others")
    algorithm = (Algorithm.DPO if dpo is not None else Algorithm.RM if rm is not None
                 else Algorithm.DISTILLATION if distillation else Algorithm.PPO if ppo else Algorithm.GRPO)
    if reward_model.enabled != (algorithm is Algorithm.RM):
        raise ValueError("policy.reward_model_cfg.enabled must be true exactly when the config has an rm section "
                         "(reward-model training): set both or neither")
    if not algorithm.uses_rollouts and not dataset_name.holds_pairs:
        raise ValueError(f"{algorithm.value} trains on preference pairs: set data.dataset_name to "
                         "arithmetic_preference (the embedded toy pairs) or jsonl (prompt/chosen/rejected rows)")
    if algorithm.uses_rollouts and not dataset_name.holds_prompts:
        raise ValueError("data.dataset_name arithmetic_preference holds preference pairs, for a dpo or rm run; "
                         "use arithmetic or jsonl for GRPO/SFT/distillation/PPO")

    return algorithm
