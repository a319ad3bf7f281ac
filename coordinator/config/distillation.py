"""The `distillation.*` section: on-policy distillation (NeMo-RL's and verl's on-policy
distillation). Its presence makes the run a distillation run: the student (policy.*) samples
through its generators exactly as in GRPO (grpo.* sets the prompts, samples, steps and
validation), a teacher served by generator services of its own (distillation.teacher.*) scores
the student's sampled tokens, and the trainer's loss is trainer_svc's DistillationLossConfig
(these keys; its formula in trainer_svc/losses/distillation.py). loss_fn.* is not used.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from coordinator.config.defaults import context_length
from coordinator.config.section import Section
from generator_svc.config import VllmSettings
from trainer_svc.types import DistillationLossConfig


class TeacherConfig(Section):
    """distillation.teacher: the teacher model and its generator services."""

    model_name: str | None = None
    """HF checkpoint directory of the teacher (required). Its tokenizer must be the policy's: it
    scores the student's token ids (checked before the run starts)."""
    num_generators: int = Field(1, ge=1)
    """Teacher generator services to launch (cluster.launch local) or to wait for (external); each
    is a generator service with teacher: true, so it scales and fails over like a generator and
    never receives weights."""
    precision: Literal["float32", "bfloat16"] | None = None
    """dtype the teacher is served in; null: policy.precision."""
    vllm_cfg: VllmSettings | None = None
    """The teacher engines' vLLM settings; null: policy.generation.vllm_cfg's with max_model_len one
    more (vLLM scores an n-token sequence as a prompt of n with one throwaway token after it), at
    most the teacher's context length. The longest prompt plus policy.generation.max_new_tokens
    plus one must fit its max_model_len (checked before the run starts)."""
    top_logprobs_k: int = Field(0, ge=0)
    """Also ask the teacher for each position's k most likely tokens (logged as
    teacher_top_k_agreement: how often the student's token is among them); 0: none. The loss uses
    the sampled tokens' logprobs only."""

    @field_validator("model_name")
    @classmethod
    def _model_dir_given(cls, value: str | None) -> str | None:
        from pathlib import Path

        if value is not None and not (Path(value) / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face checkpoint directory (no config.json); give the "
                             "teacher's checkpoint directory")
        return value


class DistillationConfig(DistillationLossConfig):
    """distillation.*: the teacher (distillation.teacher.*) and the loss's keys (trainer_svc.types.
    DistillationLossConfig: kl_penalty_coef, task_reward_coef, ratio clipping, importance sampling)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    teacher: TeacherConfig = TeacherConfig()
    """The teacher model and its generator services."""

    @model_validator(mode="after")
    def _needs_a_teacher(self) -> DistillationConfig:
        if self.teacher.model_name is None:
            raise ValueError("distillation needs a teacher: set distillation.teacher.model_name to the teacher's "
                             "Hugging Face checkpoint directory")
        return self

    def trainer_loss(self) -> DistillationLossConfig:
        """The trainer's loss: these keys' DistillationLossConfig fields."""
        return DistillationLossConfig(**self.model_dump(include=set(DistillationLossConfig.model_fields)))

    def teacher_vllm(self, policy_vllm: VllmSettings) -> VllmSettings:
        """The teacher engines' vLLM settings (teacher.vllm_cfg, else the policy's with room for one
        more token, within the teacher's context length)."""
        if self.teacher.vllm_cfg is not None:
            return self.teacher.vllm_cfg
        length = policy_vllm.max_model_len + 1
        context = context_length(self.teacher.model_name)
        return policy_vllm.model_copy(update={"max_model_len": min(length, context) if context else length})
