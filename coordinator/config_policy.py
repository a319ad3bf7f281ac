"""The `policy.*` section of the experiment configuration (NeMo-RL's keys): the model, batch
sizes, optimizer, the training backend (`dtensor_cfg` / `megatron_cfg`, resolved once at load
into a `TrainingBackend`), sequence packing and generation (vLLM, colocated or dedicated, or the trainer's own Megatron model).
"""

from __future__ import annotations

import warnings
from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coordinator.config_preference import RewardModelCfg
from trainer_svc.backends.megatron.settings import MegatronSettings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OptimizerKwargs(_Section):
    lr: float = Field(2e-4, gt=0)
    """GRPO learning rate; 5e-4 and above destabilise the embedded demo (benchmarks/calibrate_embedded.py)."""
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)


class OptimizerConfig(_Section):
    name: Literal["adamw", "torch.optim.AdamW"] = "adamw"
    kwargs: OptimizerKwargs = OptimizerKwargs()


class DTensorConfig(_Section):
    """policy.dtensor_cfg: trainer_svc/config.py DTensorSettings states each key's meaning."""

    enabled: bool = True
    """Train with the DTensor/FSDP2 backend."""
    activation_checkpointing: bool = False
    tensor_parallel_size: int = Field(1, ge=1)
    """Must divide cluster.trainer_ranks; the rest of the ranks is data parallel (FSDP)."""
    sequence_parallel: bool = False
    """Needs tensor_parallel_size > 1."""
    context_parallel_size: Literal[1] = 1
    """Context parallelism is not available in the DTensor backend: only 1."""
    cpu_offload: bool = False
    """Parameters, gradients and optimizer state in host memory between uses (FSDP2 CPU offload)."""


class SequencePackingConfig(_Section):
    """policy.sequence_packing: several samples per micro-batch row, no attention across them
    (trainer_svc/batching.py); micro-batches are then cut by token budget, not sample count."""

    enabled: bool = False
    train_mb_tokens: int = Field(2048, gt=0)
    """Most tokens per training micro-batch."""
    logprob_mb_tokens: int = Field(2048, gt=0)
    """Most tokens per logprob micro-batch."""
    algorithm: Literal["first_fit_decreasing", "concatenative"] = "first_fit_decreasing"


class MegatronConfig(MegatronSettings):
    """policy.megatron_cfg: passed to the trainer as is (its keys and meaning: trainer_svc's MegatronSettings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainingBackend(str, Enum):
    """The training backend, resolved once at load (nothing downstream re-reads the flags)."""

    DTENSOR = "dtensor"
    MEGATRON = "megatron"


def resolve_backend(dtensor: DTensorConfig, megatron: MegatronConfig) -> TrainingBackend:
    """NeMo-RL's rule: Megatron when policy.megatron_cfg.enabled (with a warning if DTensor is
    enabled too), else DTensor when policy.dtensor_cfg.enabled, else an error naming both keys."""
    if megatron.enabled:
        if dtensor.enabled:
            warnings.warn("policy.megatron_cfg.enabled and policy.dtensor_cfg.enabled are both true: "
                          "Megatron takes precedence", stacklevel=2)
        return TrainingBackend.MEGATRON
    if dtensor.enabled:
        return TrainingBackend.DTENSOR
    raise ValueError("no training backend enabled: set policy.dtensor_cfg.enabled=true "
                     "or policy.megatron_cfg.enabled=true")


class VllmConfig(_Section):
    max_model_len: int = Field(64, gt=0)
    """Longest prompt + completion the engine admits."""
    max_num_seqs: int = Field(256, gt=0)
    """Sequences one generator runs at once (its capacity)."""
    kv_cache_space_gib: int = Field(1, ge=1)
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """GPU only: the fraction of the device's memory each generator's vLLM takes. Unset: 0.9 for
    dedicated generators; colocated ones share the trainer's device, so they split 0.5 of it
    (they sleep while the trainer trains, and the trainer's rank 0 keeps its model meanwhile)."""
    enforce_eager: bool = True
    tensor_parallel_size: Literal[1] = 1


class ColocatedResourcesConfig(_Section):
    """Devices of the dedicated generators (colocated.enabled: false) on a cluster; local runs
    place every service on this host, so only null is meaningful there."""

    gpus_per_node: int | None = Field(None, ge=0)
    num_nodes: int | None = Field(None, ge=1)


class ColocatedConfig(_Section):
    """policy.generation.colocated: generators on the trainer's devices (weights by shared
    memory on the host, CUDA IPC on GPUs, where vLLM also sleeps while the trainer trains) or
    dedicated ones (weights by the weight-sync group); tandem/colocation.py decides, from the
    trainer's device kind at run time."""

    enabled: bool = False
    resources: ColocatedResourcesConfig = ColocatedResourcesConfig()

    @model_validator(mode="after")
    def _resources_for_dedicated_only(self) -> ColocatedConfig:
        if self.resources != ColocatedResourcesConfig():
            if self.enabled:
                raise ValueError("policy.generation.colocated.resources are the devices of dedicated generators; "
                                 "with colocated.enabled: true leave them null")
            warnings.warn("policy.generation.colocated.resources is ignored by local runs: every service runs on "
                          "this host (cluster.num_generators sets how many generators)", stacklevel=2)
        return self


class MegatronGenerationConfig(_Section):
    """policy.generation.mcore_generation_config: generation served by the trainer's own Megatron
    model (generation.backend: megatron)."""

    max_num_seqs: int = Field(256, gt=0)
    """Sequences decoded at once (the generator's capacity); a larger request runs in chunks."""


class GenerationConfig(_Section):
    backend: Literal["vllm", "megatron"] = "vllm"
    """vllm: dedicated (or colocated) vLLM generator services, weights sent to them after each
    step. megatron: the trainer serves generation from its own Megatron model (needs
    policy.megatron_cfg.enabled); no generator service runs and no weights travel."""
    colocated: ColocatedConfig = ColocatedConfig()
    max_new_tokens: int = Field(4, gt=0)
    """Completion budget: 3 digits + EOS for the embedded task."""
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = None
    vllm_cfg: VllmConfig = VllmConfig()
    mcore_generation_config: MegatronGenerationConfig = MegatronGenerationConfig()

    @model_validator(mode="after")
    def _backend_options(self) -> GenerationConfig:
        if self.backend == "megatron":
            if self.colocated.enabled:
                raise ValueError("policy.generation.backend=megatron generates with the trainer's own model (there "
                                 "is nothing to colocate): set policy.generation.colocated.enabled=false")
            if self.vllm_cfg != VllmConfig():
                warnings.warn("policy.generation.vllm_cfg is ignored with policy.generation.backend=megatron",
                              stacklevel=2)
        elif self.mcore_generation_config != MegatronGenerationConfig():
            warnings.warn("policy.generation.mcore_generation_config is ignored with policy.generation.backend="
                          f"{self.backend}", stacklevel=2)
        return self


class PolicyConfig(_Section):
    model_name: str | None = None
    """HF checkpoint directory. None: the embedded tiny model (built once, cached)."""
    train_global_batch_size: int = Field(128, gt=0)
    """Samples per optimizer step."""
    train_micro_batch_size: int = Field(64, gt=0)
    """Samples per forward/backward on one trainer rank."""
    logprob_batch_size: int = Field(64, gt=0)
    max_total_sequence_length: int = Field(64, gt=0)
    precision: Literal["float32", "bfloat16"] = "float32"
    max_grad_norm: float | None = Field(1.0, gt=0)
    optimizer: OptimizerConfig = OptimizerConfig()
    dtensor_cfg: DTensorConfig = DTensorConfig()
    megatron_cfg: MegatronConfig = MegatronConfig()
    sequence_packing: SequencePackingConfig = SequencePackingConfig()
    generation: GenerationConfig = GenerationConfig()
    reward_model_cfg: RewardModelCfg = RewardModelCfg()
    """Train a scalar-head reward model (with an rm section)."""
    backend: TrainingBackend | None = Field(None, exclude=True)
    """Resolved from dtensor_cfg/megatron_cfg at load; not a key to set."""

    @model_validator(mode="after")
    def _resolve_backend(self) -> PolicyConfig:
        if self.backend is not None:
            raise ValueError("policy.backend is derived from dtensor_cfg.enabled / megatron_cfg.enabled; remove it")
        object.__setattr__(self, "backend", resolve_backend(self.dtensor_cfg, self.megatron_cfg))
        if self.backend is TrainingBackend.MEGATRON and self.sequence_packing.enabled:
            raise ValueError("policy.sequence_packing is implemented by the DTensor backend only; set "
                             "policy.sequence_packing.enabled=false or policy.megatron_cfg.enabled=false")
        if self.generation.backend == "megatron" and self.backend is not TrainingBackend.MEGATRON:
            raise ValueError("policy.generation.backend=megatron generates with the trainer's Megatron model: set "
                             "policy.megatron_cfg.enabled=true (or policy.generation.backend=vllm)")
        return self

    @field_validator("model_name")
    @classmethod
    def _model_dir_exists(cls, value: str | None) -> str | None:
        if value is not None and not (Path(value) / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face checkpoint directory (no config.json); "
                             "give one, or leave policy.model_name unset for the embedded tiny model")
        return value
