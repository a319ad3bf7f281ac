"""The rollout loop's sections: `loss_fn.*` (the trainer's GRPO loss, whose schema is
trainer_svc's `GrpoLossConfig`, plus the KL-in-reward switch the coordinator applies), `grpo.*`
(GRPO and DAPO: advantages, dynamic sampling, overlong handling, validation) and `sft.*` (the
warm start)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from coordinator.config.section import Section
from trainer_svc.types import GrpoLossConfig


class LossConfig(GrpoLossConfig):
    """loss_fn: NeMo-RL's ClippedPGLossFn keys (trainer_svc.types.GrpoLossConfig) and use_kl_in_reward."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    use_kl_in_reward: bool = False
    """Subtract reference_policy_kl_penalty x sequence KL from each reward instead of adding KL to the loss."""

    @model_validator(mode="after")
    def _kl_coefficient(self) -> LossConfig:
        if self.use_kl_in_reward and not self.reference_policy_kl_penalty > 0:
            raise ValueError("use_kl_in_reward needs reference_policy_kl_penalty > 0 (the KL coefficient)")
        return self

    def trainer_loss(self) -> GrpoLossConfig:
        """The trainer's loss (no KL term in it when the KL goes into the reward)."""
        fields = self.model_dump(exclude={"use_kl_in_reward"})
        if self.use_kl_in_reward:
            fields["reference_policy_kl_penalty"] = 0.0
        return GrpoLossConfig(**fields)


class AdvEstimatorConfig(Section):
    """grpo.adv_estimator: how rewards become advantages (coordinator/loop/advantages.py)."""

    name: Literal["grpo", "reinforce_plus_plus", "raw_reward"] = "grpo"
    """grpo: group baseline (grpo.use_leave_one_out_baseline; RLOO without grpo.normalize_rewards) and
    optional std normalisation; reinforce_plus_plus: group-mean baseline (minus_baseline), then
    normalisation over the batch's tokens; raw_reward: the reward itself (plain REINFORCE)."""
    minus_baseline: bool = True
    """reinforce_plus_plus: subtract the group mean before the batch normalisation."""


class RewardShapingConfig(Section):
    """grpo.reward_shaping: DAPO's overlong penalty, linear over the last overlong_buffer_length
    tokens of the budget: min(0, -(length - (max - buffer)) / buffer * penalty)."""

    enabled: bool = False
    """Apply the overlong penalty to each reward."""
    overlong_buffer_length: int = Field(128, gt=0)
    """Tokens at the end of the budget over which the penalty grows."""
    overlong_buffer_penalty: float = Field(1.0, ge=0)
    """Penalty at the very end of the budget."""
    max_response_length: int | None = Field(None, gt=0)
    """Completion budget in tokens; null: policy.generation.max_new_tokens."""


class AsyncGRPOConfig(Section):
    """grpo.async_grpo (NeMo-RL's keys): generators roll out the next steps' prompts while the
    trainer trains (coordinator/loop/pipeline.py). Needs loss_fn.use_importance_sampling_correction
    (the generator's logprobs correct for the weights having moved on) and dedicated generators."""

    enabled: bool = False
    """Overlap rollouts with training; off: the synchronous step (the same pipeline with age 0)."""
    max_trajectory_age_steps: int = Field(1, ge=0)
    """A trajectory is trained on at most this many weight versions after the one that sampled it;
    older ones are dropped and replaced (never trained on)."""
    in_flight_weight_updates: bool = False
    """Swap weights into a generator without waiting for its calls in flight (they continue on the
    new weights; each sample then counts as old as the oldest weights that sampled any of its tokens)."""
    recompute_kv_cache_after_weight_updates: bool = False
    """With in_flight_weight_updates: recompute the KV cache of the calls in flight under the new weights."""

    @model_validator(mode="after")
    def _in_flight_options(self) -> AsyncGRPOConfig:
        if self.in_flight_weight_updates and not self.enabled:
            raise ValueError("grpo.async_grpo.in_flight_weight_updates needs grpo.async_grpo.enabled: true")
        if self.recompute_kv_cache_after_weight_updates and not self.in_flight_weight_updates:
            raise ValueError("grpo.async_grpo.recompute_kv_cache_after_weight_updates needs "
                             "grpo.async_grpo.in_flight_weight_updates: true")
        return self

    @property
    def max_age(self) -> int:
        """The pipeline's age bound: 0 for the synchronous step."""
        return self.max_trajectory_age_steps if self.enabled else 0


class GRPOConfig(Section):
    num_prompts_per_step: int = Field(16, gt=0)
    """Prompts drawn for each GRPO step (the embedded demo: 32, with the policy's batch sizes to match,
    unless the config sets any of them: coordinator/config/defaults.py)."""
    num_generations_per_prompt: int = Field(8, gt=1)
    """Completions sampled per prompt (the group its baseline is computed over)."""
    max_num_steps: int = Field(60, ge=0)
    """GRPO steps; 0 skips GRPO. Unset with the embedded model: 100 (coordinator/config/defaults.py)."""
    normalize_rewards: bool = True
    """Divide advantages by the group's reward std."""
    use_leave_one_out_baseline: bool = True
    """Baseline of each completion: its group's mean reward without it (false: with it)."""
    adv_estimator: AdvEstimatorConfig = AdvEstimatorConfig()
    advantage_clip: float | None = Field(None, gt=0)
    """Clamp advantages to [-advantage_clip, advantage_clip]; null: no clamp."""
    use_dynamic_sampling: bool = False
    """DAPO: drop prompt groups whose rewards all agree and draw more prompts until the batch is full."""
    batch_multiplier: float = Field(1.0, ge=1)
    """Dynamic sampling draws batch_multiplier x num_prompts_per_step prompts per generation round."""
    dynamic_sampling_max_gen_batches: int = Field(10, ge=1)
    """Generation rounds allowed to fill one batch before the step fails."""
    overlong_filtering: bool = False
    """Truncated completions get no loss (they still count in their group's baseline)."""
    reward_shaping: RewardShapingConfig = RewardShapingConfig()
    max_token_mult_prob_error: float | None = Field(1.05, gt=1)
    """Drift guard (coordinator/loop/drift.py): stop the run once the step's token_mult_prob_error (mean
    exp(|trainer - generator logprob|), 1.0 on-policy) stays above this for drift_grace_steps
    consecutive steps; the error names the generators that drifted. null: never stop."""
    drift_grace_steps: int = Field(2, ge=1)
    """Consecutive GRPO steps over max_token_mult_prob_error before the run stops."""
    async_grpo: AsyncGRPOConfig = AsyncGRPOConfig()
    """Rollouts overlapped with training, with a bound on the trajectories' age."""
    val_period: int = Field(10, ge=0)
    """Validate every this many steps (0: only at the start and the end)."""
    val_at_start: bool = True
    """Check the held-out accuracy before the first GRPO step (false: no check there, and no
    "before -> after" line; after an SFT warm start its last check is that starting point). The
    check samples the weights the generators loaded from the starting checkpoint: no publish
    precedes it, the first is step 1's."""
    max_val_samples: int = Field(500, gt=0)
    """Held-out prompts used by each validation (the first ones of the validation set)."""
    seed: int = 42
    """Seed of the prompt order, the trainer and the generators (generator i: seed + i)."""


class SFTConfig(Section):
    """The SFT warm start before GRPO. Unset keys (config/defaults.py): the embedded tiny model gets the
    demo's warm start (2000 steps at lr 1e-3, stopping at 40% held-out accuracy, checked every 10
    steps from 20% on); a checkpoint of yours gets none unless max_num_steps is set (then at the
    policy's lr, for all its steps)."""

    max_num_steps: int = Field(0, ge=0)
    """Most SFT optimizer steps before GRPO (the warm start); 0 skips SFT."""
    global_batch_size: int = Field(16, gt=0)
    """Samples per SFT optimizer step."""
    micro_batch_size: int = Field(64, gt=0)
    """Samples per forward/backward on one trainer rank during SFT."""
    lr: float | None = Field(None, gt=0)
    """Learning rate of the SFT phase (None: policy.optimizer.kwargs.lr)."""
    val_period: int = Field(50, gt=0)
    """Optimizer steps per trainer call; the held-out accuracy is checked after each."""
    near_target_val_period: int | None = Field(None, gt=0)
    """Steps per trainer call once a held-out check has reached half of stop_at_accuracy
    (None: val_period), so that the warm start stops near its target instead of up to
    val_period steps past it."""
    stop_at_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop the warm start once held-out accuracy reaches this (None: run max_num_steps)."""
    seed: int = 7
    """Seed of the SFT phase's example order."""
