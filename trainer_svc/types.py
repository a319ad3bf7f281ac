"""Plain domain types of the trainer service, shared by engine, server, client and callers.

No torch and no protobuf here: the coordinator imports these alongside `trainer_svc.client`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tandem.weight_sync import BucketPlan

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
    """

    token_ids: Sequence[int]
    prompt_length: int
    loss_mask: Sequence[float] | None = None
    generation_logprobs: Sequence[float] | None = None
    advantage: float = 0.0

    @property
    def completion_length(self) -> int:
        return len(self.token_ids) - self.prompt_length


@dataclass(frozen=True)
class GrpoLossConfig:
    """NeMo-RL's ClippedPGLossFn: clipped ratio to the previous policy, optional k3 KL to the
    reference and importance-sampling correction from the generation logprobs."""

    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    reference_policy_kl_penalty: float = 0.0
    use_importance_sampling_correction: bool = True


@dataclass(frozen=True)
class NllLossConfig:
    """Token-mean negative log-likelihood of the masked completion tokens (SFT)."""


LossConfig = GrpoLossConfig | NllLossConfig


@dataclass(frozen=True)
class TrainerInfo:
    """Static facts about a running trainer (GetInfo)."""

    model_name: str
    model_fingerprint: str
    backend: Literal["dtensor", "megatron"]
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
