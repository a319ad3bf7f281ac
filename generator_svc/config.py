"""Settings of a generator process and the environment vLLM reads from them.

vLLM takes part of its configuration from environment variables, read in this process
and in the engine processes it spawns. `vllm_environment` derives them from the
settings; the entry point applies them before vLLM is imported.

Thread layout (measured on 2-core machines, see notes/vllm-cpu.md): by default vLLM
pins its worker's OpenMP threads to core 0 and reserves core 1 for its scheduler, so
two generators and two trainer ranks on one 2-core box all pile onto core 0. The
default here (`cpu_threads_bind=None`) is vLLM's "nobind": the worker's threads are not
pinned and the kernel spreads processes over the cores; their number is
OMP_NUM_THREADS (1 unless the environment says otherwise). Set `cpu_threads_bind` to a
core list ("1", "0-3") to pin a generator on a machine where cores are set aside for it.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tandem.model_memory import ModelShape, kv_cache_bytes

_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
# AF_UNIX socket paths are limited to 107 bytes; vLLM puts "<run dir>/<uuid4>" sockets there.
_MAX_SCRATCH_CHARS = 107 - len("/g4194304/") - 36
_BOOL = TypeAdapter(bool)


class Executor(StrEnum):
    """vLLM's distributed_executor_backend, chosen once while the settings validate (a str: vLLM
    takes it as it is)."""

    UNI = "uni"
    MP = "mp"


class VllmSettings(BaseModel):
    """The vLLM engine's knobs (NeMo-RL's `policy.generation.vllm_cfg`): the coordinator's config
    uses this class as that section, and a generator's settings extend it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_model_len: int = Field(64, ge=8)
    """Longest prompt + completion in tokens."""
    max_num_seqs: int = Field(256, ge=1)
    """Sequences the engine runs at once; announced as this generator's capacity."""
    kv_cache_space_gib: int | None = Field(None, ge=1)
    """KV cache size on CPU in GiB (VLLM_CPU_KVCACHE_SPACE). Unset: sized from the workload,
    max_num_seqs sequences of max_model_len tokens with a margin (tandem/model_memory.py), from
    the model's config.json (1 GiB if it cannot be read). vLLM-CPU needs one or the other: left
    to itself it reserves most of the machine."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """GPU only: the fraction of the device's memory vLLM takes (weights, activations, KV cache).
    Unset: 0.9 for a dedicated generator, 0.5 for a colocated one (it shares the trainer's
    device; the coordinator splits that 0.5 between the colocated generators it launches)."""
    enforce_eager: bool | None = None
    """Skip torch.compile and CUDA graphs. Unset: eager on CPU nodes only (compiling costs 30-50 s
    more start-up there for no gain on small models); on GPU nodes (cluster.gpus_per_node > 0)
    vLLM compiles and captures CUDA graphs, its own default."""
    async_scheduling: bool = False
    """vLLM's async scheduling (it schedules step n+1 while step n runs), which vLLM 0.32 turns on
    by itself on GPUs. Off unless set: Tandem's weight-version labels, keep-mode pauses and
    in-flight updates were validated with it off (on CPU vLLM keeps it off)."""
    model_runner_v2: bool = False
    """vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER), which vLLM 0.32 picks by itself on GPUs
    with Triton. Off unless set, for the same reason as async_scheduling."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism inside one generator: its workers split every layer (CPU: gloo)."""
    pipeline_parallel_size: int = Field(1, ge=1)
    """vLLM pipeline parallelism inside one generator: its workers hold consecutive layers."""
    distributed_executor_backend: Executor | None = Field(None, validate_default=True)
    """uni: the model runs inside vLLM's engine-core process. mp: in worker processes of their own
    (vLLM's default on CPU), which busy-wait on shared memory for a second after every batch: an
    idle generator then holds a core while the trainer trains (measured: 0.43 CPU-s per 3 idle s
    with mp, 0.02 with uni, at the same tokens/s). None: uni for one worker, mp for several
    (tensor_parallel_size x pipeline_parallel_size > 1 needs a process per worker)."""
    cpu_engine_start: Literal["fork", "spawn"] = "fork"
    """How vLLM starts its engine process on CPU. fork: the child inherits the generator's
    imported vLLM (embedded model: engine built in 2.3 s instead of 7.5 s). spawn: vLLM's own
    choice on CPU, a fresh interpreter that imports vLLM and torch again. (GPUs: vLLM decides; it
    forks unless CUDA is already initialised in the generator.)"""

    @field_validator("distributed_executor_backend")
    @classmethod
    def _executor_for_workers(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Unset: derived while validating from the parallel sizes declared above it (already
        validated; if one failed, its own error is reported and nothing is derived)."""
        if value is not None or "tensor_parallel_size" not in info.data or "pipeline_parallel_size" not in info.data:
            return value
        return Executor.MP if info.data["tensor_parallel_size"] * info.data["pipeline_parallel_size"] > 1 else Executor.UNI

    @model_validator(mode="after")
    def _one_worker_for_uni(self) -> VllmSettings:
        if self.distributed_executor_backend is Executor.UNI and self.num_workers > 1:
            raise ValueError(f"vllm_cfg.distributed_executor_backend: uni runs one worker; tensor_parallel_size x "
                             f"pipeline_parallel_size = {self.num_workers} needs mp (or leave it unset)")
        return self

    @property
    def num_workers(self) -> int:
        """vLLM worker processes of one generator (each receives the whole published version)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM 0.32 accepts (vllm/config/lora.py)."""


class LoraAdapterServing(BaseModel):
    """LoRA adapters served over the base weights: each weight version is an adapter (the
    trainer's policy.dtensor_cfg.lora_cfg.weight_sync: adapter), its rank and alpha these."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    rank: int = Field(ge=1, le=VLLM_LORA_RANKS[-1])
    """The adapters' rank r (lora_cfg.dim)."""
    alpha: float = Field(gt=0)
    """The adapters' alpha (lora_cfg.alpha): vLLM scales B A by alpha / rank, as the trainer does."""

    @property
    def max_lora_rank(self) -> int:
        """The smallest rank vLLM accepts as its max_lora_rank that holds `rank`."""
        return next(r for r in VLLM_LORA_RANKS if r >= self.rank)


class GeneratorSettings(VllmSettings):
    """What one generator process serves and how (the JSON file of `--settings`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model_name: str
    """Hugging Face checkpoint directory (or hub name where downloads are possible)."""
    enforce_eager: bool = True
    """Skip torch.compile and CUDA graphs (the coordinator resolves vllm_cfg's unset value by the
    node's device kind: coordinator/launch/specs.py)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Engine dtype; received weights are converted to it by the sender's bucket plan."""
    seed: int = 0
    """Engine seed (requests without a seed draw from it)."""
    colocated: bool = False
    """On the trainer's devices. On a GPU vLLM then starts in sleep mode (tandem.colocation), so
    the coordinator can free the device for the trainer between rollouts; on CPU nothing changes."""
    in_flight_weight_updates: bool = False
    """Apply a weight version without waiting for the calls in flight (grpo.async_grpo's key): their
    requests are frozen while it is applied and go on under it; each completion then reports the
    oldest version that sampled any of its tokens. Off: a swap waits for the calls in flight."""
    recompute_kv_cache_after_weight_updates: bool = False
    """With in_flight_weight_updates: the frozen requests' KV cache is dropped and recomputed under
    the new weights. Off: they keep the old weights' KV, and prefix caching is disabled so that no
    new request reuses KV computed by old weights."""
    return_routed_experts: bool = False
    """MoE router replay (the coordinator sets it from policy.router_replay.enabled): each
    completion carries the experts vLLM routed each fed token to. On GPUs vLLM returns them
    (enable_return_routed_experts, its V2 model runner, left to vLLM's choice); on CPU, where
    that runner cannot run (it needs Triton with a GPU backend), Tandem reads them in vLLM's
    worker (generator_svc/route_capture.py) with prefix caching off."""
    teacher: bool = False
    """Serve a distillation teacher: announce as kind teacher (scored by the coordinator, never in
    the policy's rotation) and refuse weight updates."""
    stream_weight_updates: bool = True
    """Load a weight version checksum window by window while the next buckets arrive (each
    window's buckets checked against their checksums first), generation drained meanwhile: receive
    and apply overlap, and about two windows (64 MiB each by default, the trainer's
    weight_sync_checksum_window_bytes) are held instead of a whole staged copy. A transfer that
    fails after its first window then
    leaves the generator serving nothing until a publish succeeds (the coordinator retries at
    once). Used with one vLLM worker, the weight-sync group and in_flight_weight_updates off;
    otherwise (or off) the version is staged whole, then swapped in."""
    free_weights_while_training: bool = False
    """On CPU: a Sleep at level 2 frees the model's weights (vLLM-CPU has no sleep mode; Tandem's
    worker extension drops them) until the next version is loaded, generation refused meanwhile.
    The coordinator sets it for synchronous runs (policy.generation.free_weights_while_training)."""
    lora_adapters: LoraAdapterServing | None = None
    """Serve every weight version as a LoRA adapter over the base weights loaded at start (vLLM's
    LoRA support; the coordinator sets it from policy.dtensor_cfg.lora_cfg.weight_sync: adapter).
    None: weight versions are whole models, loaded into the engine's weights."""
    cpu_threads_bind: str | None = None
    """None: worker threads unpinned (vLLM "nobind"); "auto": vLLM's own pinning; or a core list like "1" or "0-3"."""
    drain_timeout_s: float = Field(60.0, ge=0)
    """On SIGTERM: how long the calls in flight may take to finish before the rest are aborted
    (the coordinator re-sends aborted prompts elsewhere)."""
    scratch_dir: Path = Path(".tandem/scratch")
    """Where vLLM's ZMQ sockets and temp files go (instead of /tmp), and its caches unless cache_dir is set."""
    cache_dir: Path | None = None
    """Where vLLM's caches go, kept across runs (instead of ~/.cache/vllm): its model-class
    inspection (without it vLLM starts one more Python process, importing vLLM again, at every
    start) and torch.compile's. None: scratch_dir."""

    @model_validator(mode="after")
    def _in_flight(self) -> GeneratorSettings:
        if self.recompute_kv_cache_after_weight_updates and not self.in_flight_weight_updates:
            raise ValueError("recompute_kv_cache_after_weight_updates needs in_flight_weight_updates: true")
        if self.in_flight_weight_updates and self.colocated:
            raise ValueError("in_flight_weight_updates needs a dedicated generator (colocated: false)")
        if self.lora_adapters is not None and (self.free_weights_while_training or self.teacher
                                               or self.in_flight_weight_updates or self.colocated):
            raise ValueError("lora_adapters serves adapters over base weights it keeps: it cannot be combined with "
                             "free_weights_while_training, teacher, in_flight_weight_updates or colocated")
        return self

    @model_validator(mode="before")
    @classmethod
    def _memory_share(cls, data: Any) -> Any:
        """Unset gpu_memory_utilization: 0.5 colocated, 0.9 dedicated, filled in before the fields
        are validated (colocated is parsed as its field would be; if it cannot be, its own error
        is reported and the share is left unset)."""
        if not isinstance(data, dict) or data.get("gpu_memory_utilization") is not None:
            return data
        try:
            colocated = _BOOL.validate_python(data.get("colocated", False))
        except ValidationError:
            return data
        return {**data, "gpu_memory_utilization": 0.5 if colocated else 0.9}

    @field_validator("cpu_threads_bind")
    @classmethod
    def _check_bind(cls, value: str | None) -> str | None:
        if value is None or value in ("auto", "nobind") or _CPU_LIST.match(value):
            return value
        raise ValueError(f'cpu_threads_bind must be null, "auto", "nobind" or a core list like "0-3", got {value!r}')

    @field_validator("scratch_dir")
    @classmethod
    def _check_scratch(cls, value: Path) -> Path:
        resolved = value.expanduser().resolve()
        if len(str(resolved)) > _MAX_SCRATCH_CHARS:
            raise ValueError(f"scratch_dir {resolved} is longer than {_MAX_SCRATCH_CHARS} characters: "
                             "vLLM puts unix sockets there; choose a shorter path")
        return resolved


def load_settings(path: Path) -> GeneratorSettings:
    """Parse the settings JSON file (unknown keys are an error naming the key)."""
    return GeneratorSettings.model_validate_json(Path(path).read_text())


def run_dir(settings: GeneratorSettings, pid: int) -> Path:
    """This process's own scratch directory (sockets, temp files), removed when it exits."""
    return settings.scratch_dir / f"g{pid}"


def vllm_environment(settings: GeneratorSettings, current: dict[str, str], run_path: Path) -> dict[str, str]:
    """Environment variables to set before vLLM is imported, given the current environment.

    Caches go to cache_dir (else scratch_dir), unless the environment already names them
    (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR: one cache shared by several Tandem homes; without
    vLLM's model-info cache a start inspects the architecture in a subprocess that imports vLLM
    once more, ~6 s); sockets and temp files go to `run_path`.
    """
    caches = settings.cache_dir or settings.scratch_dir
    env = {
        "VLLM_CACHE_ROOT": current.get("VLLM_CACHE_ROOT") or str(caches / "vllm-cache"),
        "VLLM_CONFIG_ROOT": str(settings.scratch_dir / "vllm-config"),
        # Where torch.compile runs (enforce_eager=false), its cache outlives the run; inductor's
        # precompiled header would re-run the preprocessor over torch's headers in every process.
        "TORCHINDUCTOR_CACHE_DIR": current.get("TORCHINDUCTOR_CACHE_DIR") or str(caches / "inductor-cache"),
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
        "VLLM_RPC_BASE_PATH": str(run_path),
        "TMPDIR": str(run_path),
        "VLLM_CPU_OMP_THREADS_BIND": settings.cpu_threads_bind or "nobind",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
    }
    if settings.kv_cache_space_gib is not None:  # else the engine's kv_cache_memory_bytes (kv_cache_memory_bytes())
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_space_gib)
    if settings.enforce_eager:
        # Even in eager mode vLLM's sampler torch.compiles a small logprob-rank kernel (g++ on
        # the first request: ~11 s on 2 busy cores); eager PyTorch computes the same thing.
        env["TORCHDYNAMO_DISABLE"] = "1"
    # vLLM decides the V2 model runner by itself (on with Triton on GPUs) unless told
    if settings.model_runner_v2 or not settings.return_routed_experts:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if settings.model_runner_v2 else "0"
    # else vLLM's own choice: V2 (which returns routed experts) with Triton on GPUs, V1 on CPU
    # (where Tandem captures them: generator_svc/route_capture.py)
    if settings.distributed_executor_backend is Executor.UNI:  # else vLLM's CPU platform forces "mp"
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if settings.cpu_threads_bind is None and "OMP_NUM_THREADS" not in current:
        env["OMP_NUM_THREADS"] = "1"
    return env


def kv_cache_memory_bytes(settings: GeneratorSettings) -> int | None:
    """The CPU KV cache vLLM gets as kv_cache_memory_bytes: None where kv_cache_space_gib sets it
    (VLLM_CPU_KVCACHE_SPACE), else sized from the workload and the model's shape."""
    if settings.kv_cache_space_gib is not None:
        return None
    try:
        config = json.loads((Path(settings.model_name) / "config.json").read_text())
        shape = ModelShape.from_config(config)
    except (OSError, ValueError, KeyError, TypeError):
        return 1 << 30
    return kv_cache_bytes(shape, settings.dtype, settings.max_num_seqs, settings.max_model_len)
