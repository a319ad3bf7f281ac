"""Plain domain types of the trainer service, shared by engine, server, client and callers.

No torch and no protobuf here: the coordinator imports these alongside `trainer_svc.client`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.weight_plan import BucketPlan
from trainer_svc.config import ModelHead, TrainingBackend

Policy = Literal["current", "reference"]
"""Which policy scores a batch: the one being trained or the frozen initial weights."""


@dataclass(frozen=True)
class Sample:
    """One prompt + completion as token ids.

    token_ids: prompt tokens (BOS included) followed by completion tokens.
    prompt_length: number of leading prompt tokens; no loss is taken on them (>= 1).
    loss_mask: one value per completion token (1 train, 0 skip); None means all 1.
    generation_logprobs: one per completion token, the logprob under the generator that
        sampled it; required by the GRPO loss, unused by NLL.
    advantage: applied to every completion token of the sample (GRPO).
    teacher_logprobs: one per completion token, the logprob under a distillation teacher
        (the distillation loss needs them; others ignore them).
    token_advantages: one per completion token (PPO's GAE advantages); when given they replace
        `advantage`.
    returns: one per completion token, a critic's value targets (the value loss needs them).
    values: one per completion token, the critic's values when the batch was rolled out (the
        value loss clips against them).
    routed_experts: MoE router replay: the experts the generator routed each position of
        token_ids to, flat and row-major [position, MoE layer, k] (`trainer_svc.routes`); a
        position past the rows given (the last token: the generator never fed it) is routed by
        the trainer's own router. None: no replay.
    """

    token_ids: Sequence[int]
    prompt_length: int
    loss_mask: Sequence[float] | None = None
    generation_logprobs: Sequence[float] | None = None
    advantage: float = 0.0
    teacher_logprobs: Sequence[float] | None = None
    token_advantages: Sequence[float] | None = None
    returns: Sequence[float] | None = None
    values: Sequence[float] | None = None
    routed_experts: Sequence[int] | None = None

    @property
    def completion_length(self) -> int:
        return len(self.token_ids) - self.prompt_length


KlType = Literal["k1", "k2", "k3"]
TruncatedImportanceSamplingType = Literal["tis", "icepop", "seq-mask-tis"]


class LossConfig(BaseModel):
    """A loss's settings (the base of every loss's own class, registered in `LOSSES`): validated
    at construction, immutable, unknown keys refused. The coordinator's config uses these classes
    as its `loss_fn` / `dpo` sections (one schema)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class GrpoLossConfig(LossConfig):
    """NeMo-RL's ClippedPGLossFn (field names are its `loss_fn.*` keys; `trainer_svc.losses.grpo`
    states the formula): clipped ratio to the previous policy (clip-higher through separate
    min/max, dual-clip through ratio_clip_c), KL to the reference, importance-sampling correction
    from the generation logprobs (optionally truncated), token- or sequence-level normalisation
    and GSPO's sequence-level ratio. Invalid combinations raise ValueError at construction."""

    reference_policy_kl_penalty: float = Field(0.0, ge=0)
    """KL coefficient (beta) of the KL-to-reference term."""
    ratio_clip_min: float = Field(0.2, ge=0)
    """Lower clip of the ratio: 1 - ratio_clip_min."""
    ratio_clip_max: float = Field(0.2, ge=0)
    """Upper clip of the ratio: 1 + ratio_clip_max (clip-higher when larger than ratio_clip_min)."""
    use_importance_sampling_correction: bool = True
    """Weight each token by exp(previous - generation logprob): corrects for a generator whose
    numerics (or weights, when trajectories are off-policy) differ from the trainer's."""
    token_level_loss: bool = True
    """True: mean over the step's tokens. False: mean over each sequence's tokens, then over sequences."""
    ratio_clip_c: float | None = Field(None, gt=1)
    """Dual-clip constant for negative advantages (usually 3): the token loss is at most -A * c. None: off."""
    reference_policy_kl_type: KlType = "k3"
    """KL estimator: k1 (log ratio), k2 (half squared log ratio), k3 (Schulman's unbiased, non-negative)."""
    kl_input_clamp_value: float | None = Field(20.0, gt=0)
    """Clamp of log(ref / policy) before the KL estimator (None: none)."""
    kl_output_clamp_value: float | None = Field(10.0, gt=0)
    """Clamp of the per-token KL estimate (None: none)."""
    use_on_policy_kl_approximation: bool = False
    """Weight the per-token KL by exp(curr - generation) (detached)."""
    sequence_level_importance_ratios: bool = False
    """GSPO: one ratio per sequence, exp(mean of the token log-ratios); needs token_level_loss False."""
    truncated_importance_sampling_ratio: float | None = Field(None, gt=0)
    """Upper bound of the importance weight exp(prev - generation); None: no truncation."""
    truncated_importance_sampling_type: TruncatedImportanceSamplingType = "tis"
    """tis: clamp weights to the bound; icepop: zero tokens whose weight is outside [min, max];
    seq-mask-tis: zero sequences whose geometric-mean weight is outside [min, max]."""
    truncated_importance_sampling_ratio_min: float | None = Field(None, ge=0)
    """Lower bound for icepop and seq-mask-tis."""
    disable_ppo_ratio: bool = False
    """REINFORCE/RLOO loss: -A * logprob, no ratio and no clipping."""
    force_on_policy_ratio: bool = False
    """Ratio forced to 1 in value (gradients still flow): exactly on-policy."""

    @model_validator(mode="after")
    def _valid_combination(self) -> GrpoLossConfig:
        if self.sequence_level_importance_ratios and self.token_level_loss:
            raise ValueError("sequence_level_importance_ratios (GSPO) needs token_level_loss: false")
        if self.disable_ppo_ratio and (self.sequence_level_importance_ratios or self.force_on_policy_ratio):
            raise ValueError("disable_ppo_ratio excludes sequence_level_importance_ratios and force_on_policy_ratio")
        tis = self.truncated_importance_sampling_ratio
        if tis is None:
            return self
        if not self.use_importance_sampling_correction:
            raise ValueError("truncated_importance_sampling_ratio needs use_importance_sampling_correction: true")
        if self.truncated_importance_sampling_type != "tis":
            low = self.truncated_importance_sampling_ratio_min
            if low is None or not 0 <= low <= tis:
                raise ValueError(f"truncated_importance_sampling_type {self.truncated_importance_sampling_type} "
                                 "needs 0 <= truncated_importance_sampling_ratio_min <= "
                                 "truncated_importance_sampling_ratio")
            if self.truncated_importance_sampling_type == "seq-mask-tis" and self.sequence_level_importance_ratios:
                raise ValueError("seq-mask-tis keeps token-level weights: it excludes sequence_level_importance_ratios")
        return self


class DistillationLossConfig(LossConfig):
    """On-policy distillation (`trainer_svc.losses.distillation` states the formula): the student's
    sampled tokens are scored by a teacher, and each token's advantage is
    task_reward_coef * A - kl_penalty_coef * (student logprob - teacher logprob), the sampled-token
    estimate of the reverse KL to the teacher; the clipped policy-gradient loss of GRPO trains on it."""

    kl_penalty_coef: float = Field(1.0, gt=0)
    """Weight of the per-token reverse KL to the teacher in each token's advantage."""
    task_reward_coef: float = Field(0.0, ge=0)
    """Weight of the sample's task-reward advantage (the GRPO estimator's); 0: pure distillation."""
    ratio_clip_min: float = Field(0.2, ge=0)
    """Lower clip of the ratio to the previous policy: 1 - ratio_clip_min."""
    ratio_clip_max: float = Field(0.2, ge=0)
    """Upper clip of the ratio to the previous policy: 1 + ratio_clip_max."""
    use_importance_sampling_correction: bool = True
    """Weight each token by exp(previous - generation logprob), as the GRPO loss does."""


class ValueLossConfig(LossConfig):
    """PPO's critic loss (`trainer_svc.losses.value` states the formula): half the squared error
    of the critic's per-token values against the returns, clipped around the values the batch was
    rolled out with. Trains a value model (a trainer with value_model_cfg.enabled) only."""

    cliprange_value: float | None = Field(0.5, gt=0)
    """Clip of a value's move from its rollout-time value, [v_old - c, v_old + c], in the loss
    (verl's critic.cliprange_value); null: the plain squared error."""


class NllLossConfig(LossConfig):
    """Token-mean negative log-likelihood of the masked completion tokens (SFT)."""


class DpoLossConfig(LossConfig):
    """NeMo-RL's DPOLossFn (field names are its `dpo.*` keys; `trainer_svc.losses.preference`
    states the formula): preference term -log sigmoid(beta * (r_chosen - r_rejected)) with
    r = summed (or averaged) token log-ratios to the frozen reference, plus an optional NLL term
    on the chosen completions. Samples come in (chosen, rejected) pairs (`LossKind.paired`)."""

    reference_policy_kl_penalty: float = Field(0.05, gt=0)
    """beta: scale of the reward difference inside the sigmoid."""
    preference_loss_weight: float = Field(1.0, ge=0)
    """Weight of the preference term."""
    sft_loss_weight: float = Field(0.0, ge=0)
    """Weight of the NLL of the chosen completions; 0: no SFT term."""
    preference_average_log_probs: bool = False
    """Average each completion's token log-ratios instead of summing them."""
    sft_average_log_probs: bool = False
    """Average each chosen completion's token NLL instead of summing it."""

    @model_validator(mode="after")
    def _something_to_train(self) -> DpoLossConfig:
        if self.preference_loss_weight == 0 and self.sft_loss_weight == 0:
            raise ValueError("dpo.preference_loss_weight and dpo.sft_loss_weight are both 0: nothing to train")
        return self


class BradleyTerryLossConfig(LossConfig):
    """Bradley-Terry loss of a scalar-head reward model (a sequence classifier with one label):
    -log sigmoid(score(chosen) - score(rejected)), mean over pairs. Samples come in pairs."""


@dataclass(frozen=True)
class LossKind:
    """One loss the trainer trains with, as `LOSSES` registers it: the client, the server, the
    engine and the loss builder all read it from there (a new loss is one entry, its config class,
    its `build` function and its message in TrainStepRequest's `loss` oneof)."""

    name: str
    """Its field in TrainStepRequest's `loss` oneof; that field's message carries `config`'s fields."""
    config: type[LossConfig]
    """Its settings."""
    build: str
    """"module:function" of the function that binds a `config` to its torch computation
    (returns a `trainer_svc.losses.LossFn`); named, not imported, so this module needs no torch."""
    paired: bool = False
    """Samples come in preference pairs: samples[2k] (chosen) is preferred to samples[2k + 1] (rejected)."""
    needs_generation_logprobs: bool = False
    """Every sample carries the generator's logprobs of its completion."""
    needs_teacher_logprobs: bool = False
    """Every sample carries a teacher's logprobs of its completion (distillation)."""
    reward_model: bool = False
    """Trains a scalar-head reward model, and a reward model (reward_model_cfg.enabled) trains with no other loss."""
    value_model: bool = False
    """Trains a per-token value model (a PPO critic), and a value model (value_model_cfg.enabled) trains with
    no other loss; every sample carries returns and rollout-time values."""

    @property
    def model_head(self) -> ModelHead:
        """The head the trainer's model must have to train with this loss."""
        return ModelHead.SEQUENCE_SCORE if self.reward_model else ModelHead.TOKEN_VALUE if self.value_model \
            else ModelHead.LM


LOSSES: tuple[LossKind, ...] = (
    LossKind("grpo", GrpoLossConfig, "trainer_svc.losses.grpo:build", needs_generation_logprobs=True),
    LossKind("nll", NllLossConfig, "trainer_svc.losses.nll:build"),
    LossKind("dpo", DpoLossConfig, "trainer_svc.losses.preference:build_dpo", paired=True),
    LossKind("bradley_terry", BradleyTerryLossConfig, "trainer_svc.losses.preference:build_bradley_terry",
             paired=True, reward_model=True),
    LossKind("distillation", DistillationLossConfig, "trainer_svc.losses.distillation:build",
             needs_generation_logprobs=True, needs_teacher_logprobs=True),
    LossKind("ppo_value", ValueLossConfig, "trainer_svc.losses.value:build", value_model=True),
)

"""Every loss the trainer trains with."""


def loss_kind(config: LossConfig) -> LossKind:
    """The registered loss whose settings `config` holds (an instance of its class or a subclass);
    ValueError for anything else."""
    for kind in LOSSES:
        if isinstance(config, kind.config):
            return kind
    raise ValueError(f"unknown loss {type(config).__name__}: the trainer's losses are "
                     f"{', '.join(k.config.__name__ for k in LOSSES)}")


def loss_kind_named(name: str) -> LossKind:
    """The registered loss called `name` (its `loss` oneof field); ValueError for an unknown one."""
    for kind in LOSSES:
        if kind.name == name:
            return kind
    raise ValueError(f"unknown loss {name!r}: one of {', '.join(k.name for k in LOSSES)}")


@dataclass(frozen=True)
class TrainerInfo:
    """Static facts about a running trainer (GetInfo)."""

    model_name: str
    model_fingerprint: str
    backend: TrainingBackend
    world_size: int
    device_type: str
    weight_sync_store_address: str
    bucket_plan: BucketPlan
    num_parameters: int
    global_step: int


@dataclass(frozen=True)
class StepResult:
    """Metrics of one TrainStep, averaged over its optimizer steps (num_tokens is the total)."""

    metrics: dict[str, float] = field(default_factory=dict)
    global_step: int = 0


@dataclass(frozen=True)
class PublishResult:
    """Outcome of one weight publish: bytes broadcast and gather + broadcast wall time."""

    bytes_sent: int
    duration_ms: int


@dataclass(frozen=True)
class CudaIpcExport:
    """Colocated on GPUs: the current weights as one CUDA IPC handle per bucket of the bucket
    plan (tandem.cuda_ipc payloads), alive on the trainer until released."""

    version: int
    buckets: tuple[bytes, ...]
    num_bytes: int
    duration_ms: int
