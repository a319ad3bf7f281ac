"""Settings of the trainer service (`--settings trainer.json`), validated once at start.

Field names follow NeMo-RL's `policy.*` keys where one exists (`model_name`,
`max_grad_norm`, `optimizer`, `dtensor_cfg.*`, `megatron_cfg.*` in megatron.py). Unknown keys
are errors. This is the one schema of these sections: the coordinator's `policy.*` config uses
these classes as its own, so a key has one meaning and one default wherever it is read.
"""

from __future__ import annotations

import warnings
from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from tandem.weight_plan import DEFAULT_BUCKET_BYTES  # no torch
from trainer_svc.config.lora import LoraSettings  # pydantic only
from trainer_svc.config.lora import LoraWeightSync as LoraWeightSync
from trainer_svc.config.megatron import MegatronSettings  # pydantic only: no torch, no megatron
from trainer_svc.config.megatron import megatron_conversion_problem as megatron_conversion_problem


class ModelHead(str, Enum):
    """What the trainer's model outputs, resolved once from its settings (`TrainerSettings.model_head`)."""

    LM = "lm"
    """A causal LM's logits: token logprobs (a policy)."""
    SEQUENCE_SCORE = "sequence_score"
    """One score per sequence (reward_model_cfg.enabled: a Bradley-Terry reward model)."""
    TOKEN_VALUE = "token_value"
    """One value per token (value_model_cfg.enabled: a PPO critic)."""


class TrainingBackend(str, Enum):
    """The training backend, resolved once where settings are loaded (`resolve_backend`)."""

    DTENSOR = "dtensor"
    MEGATRON = "megatron"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class OptimizerSettings(_Strict):
    """AdamW hyperparameters (no schedule: the learning rate is constant)."""

    lr: float = Field(2e-4, gt=0)
    """Learning rate; 5e-4 and above destabilise the embedded demo (benchmarks/calibrate_embedded.py)."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam beta1, beta2."""
    eps: float = Field(1e-8, gt=0)
    """Adam epsilon."""


class DTensorSettings(_Strict):
    """The DTensor/FSDP2 backend (NeMo-RL's `policy.dtensor_cfg` keys): a (dp, tp) mesh over all
    ranks; tensor parallel over "tp", every decoder layer and the root `fully_shard`ed over "dp".
    One rank training in float32 without CPU offload runs the plain model instead (same numbers,
    none of FSDP2's per-layer copies: trainer_svc/backends/dtensor/model.py `needs_fsdp`)."""

    enabled: bool = True
    """Use this backend (megatron_cfg.enabled wins when both are set)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (non-reentrant)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Ranks that split each layer (heads, MLP width, vocabulary); must divide the world size."""
    sequence_parallel: bool = False
    """With tensor_parallel_size > 1: shard the residual stream and norms along the sequence."""
    context_parallel_size: int = Field(1, ge=1)
    """Ranks that split each sequence. Accepted for NeMo-RL compatibility and refused at start:
    on CPU torch has no ring-attention kernel (its context_parallel shards only the CUDA SDPA
    kernels), and on GPUs this backend does not run it yet (megatron_cfg.context_parallel_size does)."""
    cpu_offload: bool = False
    """Keep parameters, gradients and optimizer state in host memory between uses (FSDP2
    CPUOffloadPolicy; the optimizer steps on the CPU). On a CPU-only machine nothing moves."""
    custom_parallel_plan: str | None = None
    """Dotted path to a tensor-parallel plan (NeMo-RL's form): a dict of module path patterns
    ("model.layers.*.self_attn.q_proj") to torch ParallelStyles, or a function returning one.
    Used instead of the built-in Llama-style plan when tensor_parallel_size > 1."""
    lora_cfg: LoraSettings = LoraSettings()
    """LoRA adapters (trainer_svc.config.lora)."""

    @field_validator("custom_parallel_plan")
    @classmethod
    def _dotted_path(cls, value: str | None) -> str | None:
        if value is not None and (not value or "." not in value or any(not p.isidentifier() for p in value.split("."))):
            raise ValueError(f"custom_parallel_plan must be a dotted path like 'my_pkg.plans.llama_plan', got {value!r}")
        return value

    @model_validator(mode="after")
    def _lora_layout(self) -> DTensorSettings:
        if self.lora_cfg.enabled and self.tensor_parallel_size > 1:
            raise ValueError("dtensor_cfg.lora_cfg.enabled trains adapters without tensor parallel: set "
                             "tensor_parallel_size 1 (FSDP over every rank still shards the base model)")
        if self.context_parallel_size > 1 and self.tensor_parallel_size > 1:
            raise ValueError("dtensor_cfg.context_parallel_size > 1 with tensor_parallel_size > 1 is not supported: "
                             "set one of them to 1")
        return self

    @model_validator(mode="after")
    def _sequence_parallel_needs_tp(self) -> DTensorSettings:
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ValueError("dtensor_cfg.sequence_parallel needs tensor_parallel_size > 1; set it to false")
        return self


class SequencePackingSettings(_Strict):
    """Pack each micro-batch's samples into one row (NeMo-RL's `policy.sequence_packing`):
    micro-batches are then formed by token budget, not by micro_batch_size."""

    enabled: bool = False
    """Run the model on packed rows (block-diagonal causal attention, same losses and logprobs)."""
    train_mb_tokens: int = Field(2048, gt=0)
    """Most tokens in one training micro-batch (a longer sample gets one alone)."""
    logprob_mb_tokens: int = Field(2048, gt=0)
    """Most tokens in one logprob micro-batch."""
    algorithm: Literal["first_fit_decreasing", "concatenative"] = "first_fit_decreasing"
    """How samples are grouped: longest first into the first bin with room, or in order."""


class RewardModelTrainingSettings(_Strict):
    """NeMo-RL's policy.reward_model_cfg: train a scalar-head reward model instead of a policy."""

    enabled: bool = False
    """Load model_name as a sequence classifier with one output (AutoModelForSequenceClassification,
    num_labels=1; a causal-LM checkpoint gets a fresh score head) that trains only with the
    Bradley-Terry loss; ExportHf then writes a checkpoint reward_svc's reward_model scorer serves."""
    reward_model_type: Literal["bradley_terry"] = "bradley_terry"
    """The preference model; Bradley-Terry is the only one."""


class ValueModelSettings(_Strict):
    """A PPO critic: the checkpoint's transformer with a value head, one scalar per token."""

    enabled: bool = False
    """Load model_name as a one-output token classifier (AutoModelForTokenClassification, num_labels=1,
    no dropout): the hidden state of every position through a linear layer. A causal-LM checkpoint
    gets a fresh head, initialised to zero (every value starts at 0); a checkpoint with the head
    keeps it. It serves ComputeValues and trains only with the value loss."""


MOE_MODEL_TYPES = ("qwen2_moe", "mixtral")
"""config.json model types of the mixture-of-experts families the Megatron backend converts."""


class RouterReplaySettings(_Strict):
    """MoE router replay (R3; NeMo-RL's `policy.router_replay`): the trainer routes each token to
    the experts the generator routed it to, in every forward over generated samples (logprobs,
    reference and training), so that training and inference use the same experts."""

    enabled: bool = False
    """Replay the generator's routes (samples' routed_experts) through megatron-core's
    RouterReplay. Needs the Megatron backend and a mixture-of-experts model (Qwen2-MoE, Mixtral);
    generators then return the experts vLLM routed each token to (vLLM's own output on GPUs,
    Tandem's capture in vLLM's worker on CPU: generator_svc/route_capture.py).
    Each step reports moe_router_replay_disagreement, the share of replayed (token, layer) rows
    whose experts the trainer's own router would have chosen differently."""


def model_type(model_dir: str) -> str | None:
    """model_type of the HF checkpoint directory's config.json; None when it has none."""
    import json

    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("model_type")


class GenerationSettings(_Strict):
    """Serve generation from the trainer's own model (the coordinator's policy.generation.backend:
    megatron): rank 0 also serves `tandem.generator.v1.GeneratorService` and registers as a generator."""

    enabled: bool = False
    max_num_seqs: int = Field(256, gt=0)
    """Sequences decoded at once (the capacity announced); a larger request runs in chunks."""
    max_model_len: int = Field(64, gt=1)
    """Longest prompt + completion admitted."""


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
    reward_model_cfg: RewardModelTrainingSettings = RewardModelTrainingSettings()
    """Reward-model training (a sequence classifier instead of a causal LM)."""
    value_model_cfg: ValueModelSettings = ValueModelSettings()
    """A PPO critic (a per-token value model instead of a causal LM)."""
    sequence_packing: SequencePackingSettings = SequencePackingSettings()
    """Sequence packing of micro-batches."""
    megatron_cfg: MegatronSettings = MegatronSettings()
    """Megatron-core backend settings (NeMo-RL's `policy.megatron_cfg`)."""
    weight_sync_host: str = "127.0.0.1"
    """Interface the weight-sync TCPStore (on rank 0) binds and advertises."""
    checkpoint_direct_io: bool = True
    """DTensor checkpoint files written and read with O_DIRECT where the filesystem takes it
    (checkpointing.direct_io; trainer_svc/backends/dtensor/direct_io.py)."""
    weight_sync_bucket_bytes: int = Field(DEFAULT_BUCKET_BYTES, gt=0)
    """Bytes per weight-sync bucket (one broadcast each) of the tensors packed together: the
    sender holds two (one filling, one on the wire; none where its parameters are one block laid
    out as the plan, trainer_svc/publish.py), and so does a generator on a GPU."""
    weight_sync_in_place_bytes: int | None = Field(1 << 20, gt=0)
    """A tensor of at least this many bytes travels in a weight-sync bucket of its own, broadcast
    straight from its memory when it is already in the dtype the generators serve (no copy into a
    bucket, none out of it on the generator); smaller ones are packed. null: every tensor packed.
    At Qwen2.5-0.5B's shape the default sends the publish at 71-77% of a raw broadcast's
    bandwidth (benchmarks/publish_real_size.py). Unused where the trainer keeps the published
    parameters in one block (one rank, training in the generators' dtype: trainer_svc/publish.py),
    which sends every bucket from their memory."""
    weight_sync_checksum_window_bytes: int | None = Field(64 << 20, gt=0)
    """Consecutive weight-sync buckets of at least this many bytes together share one checksum
    broadcast, sent after the window's last bucket (null: one per bucket). A generator applies a
    window once its checksums matched, so a streamed update holds about two windows at a time; at the
    0.5B shape the 194 buckets need 20 checksum broadcasts instead of 194
    (benchmarks/publish_real_size.py)."""
    weight_sync_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """dtype the generators receive: the one they serve (the coordinator sets it to the dtype it
    gives them, policy.precision), so they serve what the trainer trains, in as few bytes as that
    takes; auto: the checkpoint's own dtype (config.json), for a trainer started on its own."""
    lockstep_timeout_s: float = Field(7 * 24 * 3600, gt=0)
    """How long ranks other than 0 wait for the next command (time between RPCs)."""
    generation: GenerationSettings = GenerationSettings()
    """Generation served from the trainer's own model (Megatron backend only)."""
    router_replay: RouterReplaySettings = RouterReplaySettings()
    """MoE router replay (Megatron backend, mixture-of-experts models)."""

    backend: TrainingBackend | None = Field(None, exclude=True, validate_default=True)
    """Resolved from dtensor_cfg.enabled / megatron_cfg.enabled at load (resolve_backend); not a key to set."""

    @field_validator("backend")
    @classmethod
    def _resolve_backend(cls, value: TrainingBackend | None, info: ValidationInfo) -> TrainingBackend | None:
        """Derived while validating (the sections are declared above it, so they are validated
        by now); whatever was passed is ignored. None when no backend is enabled (refused by
        `_backend_chosen`) or a section failed its own validation (reported by it)."""
        dtensor, megatron = info.data.get("dtensor_cfg"), info.data.get("megatron_cfg")
        if dtensor is None or megatron is None or not (dtensor.enabled or megatron.enabled):
            return None
        return resolve_backend(dtensor, megatron)

    @model_validator(mode="after")
    def _backend_chosen(self) -> TrainerSettings:
        if self.backend is None:
            resolve_backend(self.dtensor_cfg, self.megatron_cfg)  # raises, naming both keys
        if self.generation.enabled and self.backend is not TrainingBackend.MEGATRON:
            raise ValueError("generation.enabled serves generation from the Megatron model: set megatron_cfg.enabled=true")
        if self.generation.enabled and self.megatron_cfg.context_parallel_size > 1:
            raise ValueError("generation.enabled (policy.generation.backend: megatron) decodes whole rows: set "
                             "megatron_cfg.context_parallel_size to 1 or generate with vLLM")
        if self.router_replay.enabled:
            check_router_replay(self.backend, self.model_name, prefix="")
        if self.reward_model_cfg.enabled and self.value_model_cfg.enabled:
            raise ValueError("reward_model_cfg.enabled and value_model_cfg.enabled are exclusive: a trainer holds a "
                             "reward model or a critic; set one of them to false")
        if self.value_model_cfg.enabled and (self.backend is not TrainingBackend.DTENSOR or self.generation.enabled
                                             or self.sequence_packing.enabled or self.dtensor_cfg.lora_cfg.enabled
                                             or self.dtensor_cfg.tensor_parallel_size > 1):
            raise ValueError("value_model_cfg.enabled (a PPO critic) trains on the DTensor backend without tensor "
                             "parallel, sequence packing, LoRA or generation for now: set megatron_cfg.enabled=false, "
                             "dtensor_cfg.tensor_parallel_size=1, sequence_packing.enabled=false, "
                             "dtensor_cfg.lora_cfg.enabled=false")
        if self.backend is TrainingBackend.DTENSOR:
            dtensor = self.dtensor_cfg
            if dtensor.lora_cfg.enabled and self.reward_model_cfg.enabled:
                raise ValueError("dtensor_cfg.lora_cfg with reward_model_cfg.enabled is not supported: LoRA trains a "
                                 "causal LM's adapters; set lora_cfg.enabled=false")
            if dtensor.context_parallel_size > 1 and (self.sequence_packing.enabled or self.reward_model_cfg.enabled):
                raise ValueError("dtensor_cfg.context_parallel_size > 1 works on unpacked causal-LM batches: set "
                                 "sequence_packing.enabled=false (and reward_model_cfg.enabled=false)")
        return self

    @property
    def model_head(self) -> ModelHead:
        """The model's head (ModelHead), from reward_model_cfg / value_model_cfg."""
        if self.reward_model_cfg.enabled:
            return ModelHead.SEQUENCE_SCORE
        return ModelHead.TOKEN_VALUE if self.value_model_cfg.enabled else ModelHead.LM


def check_router_replay(backend: TrainingBackend | None, model_name: str | None, *, prefix: str) -> None:
    """ValueError, naming the keys (after `prefix`), unless router replay can run: the Megatron
    backend on a mixture-of-experts checkpoint. `model_name` None: the model is not known yet (the
    coordinator's embedded model or a directory given at launch), checked when the trainer's
    settings are made from it."""
    if backend is not TrainingBackend.MEGATRON:
        raise ValueError(f"{prefix}router_replay replays routes in the Megatron backend's forward: set "
                         f"{prefix}megatron_cfg.enabled=true or {prefix}router_replay.enabled=false")
    if model_name is None:
        return
    kind = model_type(model_name)
    if kind not in MOE_MODEL_TYPES:
        what = f"a {kind!r} checkpoint" if kind else f"{model_name!r}, whose config.json has no model_type"
        raise ValueError(f"{prefix}router_replay needs a mixture-of-experts model ({', '.join(MOE_MODEL_TYPES)}); "
                         f"{prefix}model_name is {what}: set {prefix}router_replay.enabled=false")


def resolve_backend(
dtensor: DTensorSettings, megatron: MegatronSettings, *, prefix: str = "") -> TrainingBackend:
    """NeMo-RL's rule: Megatron when megatron_cfg.enabled (with a warning if DTensor is enabled
    too), else DTensor when dtensor_cfg.enabled, else an error naming both keys (after `prefix`,
    "policy." in an experiment config)."""
    if megatron.enabled:
        if dtensor.enabled:
            warnings.warn(f"{prefix}megatron_cfg.enabled and {prefix}dtensor_cfg.enabled are both true: "
                          "Megatron takes precedence", stacklevel=2)
        return TrainingBackend.MEGATRON
    if dtensor.enabled:
        return TrainingBackend.DTENSOR
    raise ValueError(f"no training backend enabled: set {prefix}dtensor_cfg.enabled=true or "
                     f"{prefix}megatron_cfg.enabled=true")


def load_settings(path: str | Path) -> TrainerSettings:
    """Read and validate a settings JSON file; a pydantic ValidationError names the bad key."""
    return TrainerSettings.model_validate_json(Path(path).read_text())
