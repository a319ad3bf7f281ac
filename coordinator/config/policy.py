"""The `policy.*` section (NeMo-RL's keys): the model, batch sizes, the optimizer, the training
backend and generation.

The trainer's sections (`optimizer.kwargs`, `dtensor_cfg`, `megatron_cfg`, `sequence_packing`,
`reward_model_cfg`) are trainer_svc's own settings classes, and `generation.vllm_cfg` is
generator_svc's `VllmSettings`: each key has one schema and one default, owned by the service
that reads it. Two choices are resolved here once, at load, into enums nothing downstream
re-derives: the training backend (trainer_svc.config.resolve_backend) and the generation backend.
"""

from __future__ import annotations

import warnings
from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from coordinator.config.section import Section
from generator_svc.config import VllmSettings
from trainer_svc.config import (
    DTensorSettings,
    MegatronSettings,
    OptimizerSettings,
    RewardModelTrainingSettings,
    RouterReplaySettings,
    SequencePackingSettings,
    TrainingBackend,
    check_router_replay,
    resolve_backend,
)


class GenerationBackend(str, Enum):
    """Who generates the rollouts."""

    VLLM = "vllm"
    """Generator services running vLLM (dedicated or colocated); weights are sent after each step."""
    MEGATRON = "megatron"
    """The trainer, from its own Megatron model: no generator service runs and no weights travel."""

    @property
    def separate_services(self) -> bool:
        """Whether generator services are launched (and waited for) beside the trainer."""
        return self is GenerationBackend.VLLM


class OptimizerConfig(Section):
    name: Literal["adamw", "torch.optim.AdamW"] = "adamw"
    """The optimizer (AdamW only)."""
    kwargs: OptimizerSettings = OptimizerSettings()
    """lr, weight_decay, betas, eps (trainer_svc.config.OptimizerSettings)."""


class ColocatedResourcesConfig(Section):
    """Devices of the dedicated generators (colocated.enabled: false) on a cluster; local runs
    place every service on this host, so only null is meaningful there."""

    gpus_per_node: int | None = Field(None, ge=0)
    """GPUs per generator node (None: cluster.gpus_per_node)."""
    num_nodes: int | None = Field(None, ge=1)
    """Nodes of the generators (None: as many as the generators fill)."""


class ColocatedConfig(Section):
    """policy.generation.colocated: generators on the trainer's devices (weights by shared
    memory on the host, CUDA IPC on GPUs, where vLLM also sleeps while the trainer trains) or
    dedicated ones (weights by the weight-sync group); tandem/colocation.py decides, from the
    trainer's device kind at run time."""

    enabled: bool = False
    """Generators share the trainer's devices."""
    resources: ColocatedResourcesConfig = ColocatedResourcesConfig()
    """Devices of dedicated generators (cluster placement only)."""

    @model_validator(mode="after")
    def _resources_for_dedicated_only(self) -> ColocatedConfig:
        if self.resources != ColocatedResourcesConfig():
            if self.enabled:
                raise ValueError("policy.generation.colocated.resources are the devices of dedicated generators; "
                                 "with colocated.enabled: true leave them null")
            warnings.warn("policy.generation.colocated.resources is ignored by local runs: every service runs on "
                          "this host (cluster.num_generators sets how many generators)", stacklevel=2)
        return self


class MegatronGenerationConfig(Section):
    """policy.generation.mcore_generation_config: generation served by the trainer's own Megatron
    model (generation.backend: megatron)."""

    max_num_seqs: int = Field(256, gt=0)
    """Sequences decoded at once (the generator's capacity); a larger request runs in chunks."""


class GenerationConfig(Section):
    backend: GenerationBackend = GenerationBackend.VLLM
    """vllm: dedicated (or colocated) vLLM generator services, weights sent to them after each
    step. megatron: the trainer serves generation from its own Megatron model (needs
    policy.megatron_cfg.enabled); no generator service runs and no weights travel."""
    colocated: ColocatedConfig = ColocatedConfig()
    """Colocated or dedicated generators."""
    max_new_tokens: int | None = Field(None, gt=0)
    """Completion budget in tokens. Unset: 4 for the embedded task (3 digits + EOS), else half of
    policy.max_total_sequence_length (config/defaults.py); it must leave room for a prompt."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of the rollouts (validation is greedy)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass; 1 disables it."""
    top_k: int | None = None
    """Top-k cutoff; null disables it."""
    vllm_cfg: VllmSettings = VllmSettings()
    """The vLLM engine's settings (generator_svc.config.VllmSettings)."""
    free_weights_while_training: bool | None = None
    """CPU generators free their copy of the model after the rollouts and the next publish loads it
    anew (tandem/colocation.py), so the trainer's step has that memory (at Qwen2.5-0.5B's shape in
    float32 the whole run's peak was 3.8 GiB lower; each reload then faults its memory in again, so
    the publish took 2.9 s against 2.2 s: benchmarks/results/2026-12-02-checksum-windows.md). Unset:
    on for synchronous runs on CPU machines (cluster.gpus_per_node 0); async GRPO generates while
    the trainer trains and cannot."""
    mcore_generation_config: MegatronGenerationConfig = MegatronGenerationConfig()
    """The trainer's own generation (backend: megatron)."""

    @model_validator(mode="after")
    def _backend_options(self) -> GenerationConfig:
        if not self.backend.separate_services:
            if self.colocated.enabled:
                raise ValueError("policy.generation.backend=megatron generates with the trainer's own model (there "
                                 "is nothing to colocate): set policy.generation.colocated.enabled=false")
            if self.vllm_cfg != VllmSettings():
                warnings.warn("policy.generation.vllm_cfg is ignored with policy.generation.backend=megatron",
                              stacklevel=2)
        elif self.mcore_generation_config != MegatronGenerationConfig():
            warnings.warn("policy.generation.mcore_generation_config is ignored with policy.generation.backend="
                          f"{self.backend.value}", stacklevel=2)
        return self


class PolicyConfig(Section):
    model_name: str | None = None
    """HF checkpoint directory. None: the embedded tiny model (built once, cached)."""
    train_global_batch_size: int = Field(128, gt=0)
    """Samples per optimizer step."""
    train_micro_batch_size: int = Field(64, gt=0)
    """Samples per forward/backward on one trainer rank."""
    logprob_batch_size: int = Field(64, gt=0)
    """Samples per logprob forward on one trainer rank."""
    max_total_sequence_length: int | None = Field(None, gt=0)
    """Longest prompt + completion the trainer takes (and, unless set, vllm_cfg.max_model_len). Unset:
    64 for the embedded model, else the model's context length capped at 1024."""
    precision: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the trainer and the generators."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; null: no clipping."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """The optimizer and its hyperparameters."""
    dtensor_cfg: DTensorSettings = DTensorSettings()
    """The DTensor/FSDP2 backend (trainer_svc.config.DTensorSettings)."""
    megatron_cfg: MegatronSettings = MegatronSettings()
    """The Megatron-core backend (trainer_svc.config.megatron.MegatronSettings)."""
    sequence_packing: SequencePackingSettings = SequencePackingSettings()
    """Several samples per micro-batch row (DTensor backend)."""
    generation: GenerationConfig = GenerationConfig()
    """Who generates the rollouts, and how."""
    reward_model_cfg: RewardModelTrainingSettings = RewardModelTrainingSettings()
    """Train a scalar-head reward model (with an rm section)."""
    router_replay: RouterReplaySettings = RouterReplaySettings()
    """MoE router replay, R3 (trainer_svc.config.RouterReplaySettings): the vLLM generators return
    the experts they routed each token to and the Megatron trainer replays them."""
    backend: TrainingBackend | None = Field(None, exclude=True)
    """Resolved from dtensor_cfg/megatron_cfg at load; not a key to set."""

    @model_validator(mode="after")
    def _resolve_backend(self) -> PolicyConfig:
        if self.backend is not None:
            raise ValueError("policy.backend is derived from dtensor_cfg.enabled / megatron_cfg.enabled; remove it")
        object.__setattr__(self, "backend", resolve_backend(self.dtensor_cfg, self.megatron_cfg,
                                                                prefix="policy."))
        if self.backend is TrainingBackend.MEGATRON and self.sequence_packing.enabled:
            raise ValueError("policy.sequence_packing is implemented by the DTensor backend only; set "
                             "policy.sequence_packing.enabled=false or policy.megatron_cfg.enabled=false")
        if self.router_replay.enabled:
            check_router_replay(self.backend, self.model_name, prefix="policy.")
            if not self.generation.backend.separate_services:
                raise ValueError("policy.router_replay replays the routes of vLLM generators; with "
                                 "policy.generation.backend=megatron the trainer generates with its own routers: "
                                 "set policy.router_replay.enabled=false")
        if not self.generation.backend.separate_services and self.backend is not TrainingBackend.MEGATRON:
            raise ValueError("policy.generation.backend=megatron generates with the trainer's Megatron model: set "
                             "policy.megatron_cfg.enabled=true (or policy.generation.backend=vllm)")
        return self

    @property
    def generation_limit(self) -> tuple[int, str]:
        """The longest prompt + completion the generators take, and the key that sets it: vLLM's
        max_model_len, or the trainer's own limit when it generates (generation.backend megatron)."""
        if self.generation.backend.separate_services:
            return self.generation.vllm_cfg.max_model_len, "policy.generation.vllm_cfg.max_model_len"
        return self.max_total_sequence_length, "policy.max_total_sequence_length"

    @field_validator("model_name")
    @classmethod
    def _model_dir_exists(cls, value: str | None) -> str | None:
        if value is not None and not (Path(value) / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face checkpoint directory (no config.json); "
                             "give one, or leave policy.model_name unset for the embedded tiny model")
        return value
