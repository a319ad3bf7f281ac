"""TrainerEngine: the trainer's domain object (no gRPC).

On rank 0 each public method validates its arguments, then runs one command on every rank
through the lockstep channel; ranks > 0 run the same commands in `follow()`. Only rank 0
calls the public methods; their results are rank 0's. One exception: `publish_held` sends a
copy `hold_weights` took (async GRPO) from rank 0 alone, on the caller's thread, beside the
command running then (a train step).

Weight versions: the trainer's weights are version `weight_version` right after a publish or
a hold (0: the loaded checkpoint); a train step or a checkpoint load moves them past it until
the next one. The generation the trainer may serve itself (`generate`, with a `Decoder`)
samples only from published weights, labelled with their version.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.generation.types import SamplingConfig
from tandem.host_memory import release_free_memory
from tandem.rpc import FailedPrecondition
from tandem.weight_sync import BucketPlan, GroupSpec, WeightSender
from trainer_svc.backends import build_backend
from trainer_svc.batching import validate_samples, validate_train_layout
from trainer_svc.config import ModelHead, TrainerSettings
from trainer_svc.cuda_ipc import CudaIpcExports
from trainer_svc.decode import Decoder, DecodeRequest, DecodeSink
from trainer_svc.distributed import close_distributed, init_distributed
from trainer_svc.hf import eos_token_ids, head_config, model_fingerprint, write_hf_checkpoint
from trainer_svc.interfaces import TrainerBackend
from trainer_svc.lockstep import Lockstep
from trainer_svc.pairs import validate_pairs
from trainer_svc.publish import DetachedPublishes, plan_dtype, publish_weights, weight_sync_plan
from trainer_svc.types import (
    LOSSES,
    CudaIpcExport,
    LossConfig,
    Policy,
    PublishResult,
    Sample,
    StepResult,
    TrainerInfo,
    loss_kind,
)

_HEADS = {ModelHead.LM: "policy", ModelHead.SEQUENCE_SCORE: "reward model", ModelHead.TOKEN_VALUE: "critic"}
"""How errors name the model a trainer holds."""


@dataclass(frozen=True)
class _ComputeLogprobs:
    samples: tuple[Sample, ...]
    policy: Policy
    micro_batch_size: int


@dataclass(frozen=True)
class _ComputeValues:
    samples: tuple[Sample, ...]
    micro_batch_size: int


@dataclass(frozen=True)
class _TrainStep:
    samples: tuple[Sample, ...]
    loss: LossConfig
    global_batch_size: int
    micro_batch_size: int
    learning_rate: float | None


@dataclass(frozen=True)
class _PublishWeights:
    group: GroupSpec
    version: int
    detach: bool = False


@dataclass(frozen=True)
class _HoldWeights:
    version: int


@dataclass(frozen=True)
class _ExportCudaIpc:
    version: int


@dataclass(frozen=True)
class _ReleaseCudaIpc:
    version: int


@dataclass(frozen=True)
class _SaveCheckpoint:
    path: Path
    background: bool = False


@dataclass(frozen=True)
class _LoadCheckpoint:
    path: Path


@dataclass(frozen=True)
class _ExportHf:
    path: Path
    for_generators: bool = False


class TrainerEngine:
    """Drives a TrainerBackend on every rank; rank 0 also owns the WeightSender."""

    def __init__(self, backend: TrainerBackend, lockstep: Lockstep, *, model_name: str, plan: BucketPlan,
                 sender: WeightSender | None, fingerprint: str, log: Any, head: ModelHead = ModelHead.LM,
                 decoder: Decoder | None = None):
        self._backend = backend
        self._head = head  # a reward model trains with Bradley-Terry only, a critic with the value loss only
        self._lockstep = lockstep
        self._model_name = model_name
        self._plan = plan
        self._sender = sender
        self._fingerprint = fingerprint
        self._log = log
        self._decoder = decoder
        self.weight_version = 0
        self._ipc = CudaIpcExports(backend.device, log)  # colocated generators on GPUs (trainer_svc/cuda_ipc.py)
        self._weights_moved = False  # trained or loaded since weight_version was published
        self._detached = DetachedPublishes(log)  # async GRPO's background broadcasts (publish.py)

    @property
    def is_leader(self) -> bool:
        return self._backend.rank == 0

    # ------------------------------------------------------------------ rank 0 API

    def info(self) -> TrainerInfo:
        return TrainerInfo(
            model_name=self._model_name, model_fingerprint=self._fingerprint, backend=self._backend.backend_kind,
            world_size=self._backend.world_size, device_type=self._backend.device.type,
            weight_sync_store_address=self._sender.address if self._sender else "", bucket_plan=self._plan,
            num_parameters=self._backend.num_parameters, global_step=self._backend.global_step)

    def logprobs(self, samples: Sequence[Sample], policy: Policy, micro_batch_size: int) -> list[list[float]]:
        if policy not in ("current", "reference"):
            raise ValueError(f"policy must be 'current' or 'reference', got {policy!r}")
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
        if self._head is not ModelHead.LM:
            raise ValueError(f"this trainer holds a {_HEADS[self._head]} (reward_model_cfg.enabled or "
                             "value_model_cfg.enabled): it has no token logprobs")
        validate_samples(samples, self._backend.vocab_size, need_generation_logprobs=False)
        return self._run(_ComputeLogprobs(tuple(samples), policy, micro_batch_size))

    def values(self, samples: Sequence[Sample], micro_batch_size: int) -> list[list[float]]:
        """A critic's value of each completion token's state (the prompt and the completion before
        it), one per completion token, aligned as the logprobs are."""
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
        if self._head is not ModelHead.TOKEN_VALUE:
            raise ValueError("this trainer holds no value model (value_model_cfg.enabled is false): values come "
                             "from a PPO critic")
        validate_samples(samples, self._backend.vocab_size, need_generation_logprobs=False)
        return self._run(_ComputeValues(tuple(samples), micro_batch_size))

    def train_step(self, samples: Sequence[Sample], loss: LossConfig, global_batch_size: int,
                   micro_batch_size: int, learning_rate: float | None = None) -> StepResult:
        """Optimizer steps over `samples`; learning_rate overrides the configured one for this call."""
        kind = loss_kind(loss)
        if self._head is not kind.model_head:
            def losses(head: ModelHead) -> str:
                return " / ".join(k.config.__name__ for k in LOSSES if k.model_head is head)
            raise ValueError(f"got {type(loss).__name__} for a trainer holding a {_HEADS[self._head]}: a reward model "
                             f"trains only with {losses(ModelHead.SEQUENCE_SCORE)}, a critic only with "
                             f"{losses(ModelHead.TOKEN_VALUE)} and a policy with the others "
                             "(reward_model_cfg.enabled / value_model_cfg.enabled choose the model)")
        validate_samples(samples, self._backend.vocab_size, need_generation_logprobs=kind.needs_generation_logprobs,
                         need_teacher_logprobs=kind.needs_teacher_logprobs, need_value_targets=kind.value_model)
        validate_train_layout(len(samples), global_batch_size, micro_batch_size, self._backend.world_size)
        if kind.paired:
            validate_pairs(samples, global_batch_size, micro_batch_size, self._backend.world_size)
        if learning_rate is not None and not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        self._weights_moved = True
        result = self._run(_TrainStep(tuple(samples), loss, global_batch_size, micro_batch_size, learning_rate))
        self._log.info("train_step", global_step=result.global_step, **{k: round(v, 6) for k, v in result.metrics.items()})
        return result

    def publish_weights(self, group: GroupSpec, version: int, detach: bool = False) -> PublishResult:
        """Broadcast the weights to `group` as `version`; a group of the trainer alone sends
        nothing and only makes the version the trainer's (what its own generation serves).
        detach: return once rank 0 holds a copy, broadcasting it in the background (publish.py)."""
        if group.world_size < 1:
            raise ValueError(f"a weight-sync group holds at least the trainer, got world_size {group.world_size}")
        if detach and self._decoder is not None:
            raise FailedPrecondition("a trainer that generates itself takes no detached publish (async GRPO needs "
                                     "generator services)")
        start = time.perf_counter()
        bytes_sent = self._run(_PublishWeights(group, version, detach)) if group.world_size > 1 else 0
        self.weight_version = version
        self._weights_moved = False
        result = PublishResult(bytes_sent, int((time.perf_counter() - start) * 1000))
        self._log.info("weights_published", version=version, epoch=group.epoch, bytes=bytes_sent,
                       duration_ms=result.duration_ms)
        return result

    def hold_weights(self, version: int) -> PublishResult:
        """Async GRPO: copy the weights as `version` (every rank gathers, rank 0 keeps the copy)
        and return; `publish_held` then sends the copy while the trainer trains on. The result's
        bytes are what that broadcast will send."""
        if self._decoder is not None:
            raise FailedPrecondition("a trainer that generates itself takes no detached publish (async GRPO needs "
                                     "generator services)")
        start = time.perf_counter()
        self._run(_HoldWeights(version))
        self.weight_version = version
        self._weights_moved = False
        result = PublishResult(self._plan.total_bytes, int((time.perf_counter() - start) * 1000))
        self._log.info("weights_held", version=version, duration_ms=result.duration_ms)
        return result

    def holds(self, version: int) -> bool:
        """Whether rank 0 holds a copy of `version` (hold_weights, or a detached publish)."""
        return self._detached.holds(version)

    def publish_held(self, group: GroupSpec, version: int) -> PublishResult:
        """Rank 0, on the caller's thread, beside the engine's commands: broadcast the held copy
        of `version` to `group` in the background; returns once it has started."""
        if not self.is_leader:
            raise FailedPrecondition("only trainer rank 0 takes calls")
        start = time.perf_counter()
        try:
            num_bytes = self._detached.send_held(self._sender, group, version, self._plan) if group.world_size > 1 else 0
        except LookupError as exc:
            raise FailedPrecondition(f"{exc}: hold it (HoldWeights) before publishing it") from exc
        result = PublishResult(num_bytes, int((time.perf_counter() - start) * 1000))
        self._log.info("weights_published", version=version, epoch=group.epoch, bytes=num_bytes, held=True,
                       duration_ms=result.duration_ms)
        return result

    def export_cuda_ipc(self, version: int) -> CudaIpcExport:
        """Colocated on GPUs: the current weights as CUDA IPC handles of the plan's buckets on
        rank 0's device, held until `release_cuda_ipc(version)`."""
        if self._backend.device.type != "cuda":
            raise FailedPrecondition(f"CUDA IPC weights need a trainer on GPUs; this one runs on "
                                     f"{self._backend.device.type} (colocated CPU runs pass weights through shared memory)")
        start = time.perf_counter()
        buckets = self._run(_ExportCudaIpc(version))
        result = CudaIpcExport(version, tuple(buckets), self._plan.total_bytes, int((time.perf_counter() - start) * 1000))
        self._log.info("weights_exported_cuda_ipc", version=version, buckets=len(buckets), bytes=result.num_bytes,
                       duration_ms=result.duration_ms)
        return result

    def release_cuda_ipc(self, version: int) -> bool:
        """Free the buckets of `version`'s export (every rank also empties its CUDA cache)."""
        return self._run(_ReleaseCudaIpc(version))

    def save_checkpoint(self, path: str, background: bool = False) -> int:
        """Returns the wall time in milliseconds. With `background` the bytes may still be on
        their way to disk: the checkpoint is complete once `checkpoint_written` says so."""
        target = writable_dir(path, "checkpoint")
        start = time.perf_counter()
        self._run(_SaveCheckpoint(target, background))
        return int((time.perf_counter() - start) * 1000)

    def checkpoint_written(self, path: str, timeout_s: float) -> bool:
        """Rank 0, on the caller's thread, beside the engine's commands: wait up to timeout_s for
        the save into `path` to be on disk on every rank and mark it complete; whether it is."""
        if not self.is_leader:
            raise FailedPrecondition("only trainer rank 0 takes calls")
        if not path:
            raise ValueError("checkpoint path is empty")
        if not 0 <= timeout_s <= 86_400:  # NaN too
            raise ValueError(f"timeout_s must be within [0, 86400] seconds, got {timeout_s}")
        return self._backend.checkpoint_written(Path(path).expanduser().absolute(), timeout_s)

    def load_checkpoint(self, path: str) -> int:
        if not path:
            raise ValueError("checkpoint path is empty")
        target = Path(path).expanduser().absolute()
        if not target.is_dir():
            raise ValueError(f"no checkpoint at {target}: not a directory")
        self._weights_moved = True
        return self._run(_LoadCheckpoint(target))

    def export_hf(self, path: str, for_generators: bool = False) -> int:
        """An HF checkpoint of the current weights, in the checkpoint's dtype, or with
        `for_generators` (a version they load from it) in the one they serve (the bucket plan's)."""
        return self._run(_ExportHf(writable_dir(path, "export"), for_generators))

    @property
    def serves_generation(self) -> bool:
        return self._decoder is not None

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, sink: DecodeSink) -> bool:
        """Sample from the trainer's own model on every rank (`trainer_svc.decode`); completions
        go to `sink` as they finish. Returns False if `sink.aborted()` cut it short."""
        if self._decoder is None:
            raise FailedPrecondition("this trainer does not serve generation (policy.generation.backend is not megatron)")
        if self._weights_moved:
            raise FailedPrecondition(f"the trainer's weights moved past the published version {self.weight_version} "
                                     "(a train step or checkpoint load since): publish before generating")
        request = DecodeRequest(tuple(tuple(p) for p in prompts), sampling, self.weight_version)
        return self._run(request, lambda command: self._execute(command, sink))

    def close(self) -> None:
        """Rank 0: release the followers, then the sender and the process groups."""
        self._detached.wait()
        if self.is_leader:
            self._lockstep.shutdown()
            if self._sender is not None:
                self._sender.close()
        self._backend.close()
        close_distributed()

    # ------------------------------------------------------------------ every rank

    def follow(self) -> None:
        """Ranks > 0: run rank 0's commands until it shuts down."""
        self._lockstep.follow(self._execute, lambda exc: self._log.error("command_failed", exc_info=exc))

    def _run(self, command: Any, execute: Any = None) -> Any:
        if not self.is_leader:
            raise FailedPrecondition("only trainer rank 0 takes calls")
        return self._lockstep.run(command, execute or self._execute)

    def _execute(self, command: Any, sink: DecodeSink | None = None) -> Any:
        """Run one command on this rank; `sink` is rank 0's end of a generate call."""
        backend = self._backend
        match command:
            case DecodeRequest():
                assert self._decoder is not None, "rank 0 checked that this trainer serves generation"
                return self._decoder.run(command, sink)
            case _ComputeLogprobs(samples, policy, micro_batch_size):
                return backend.compute_logprobs(samples, policy, micro_batch_size)
            case _ComputeValues(samples, micro_batch_size):
                return backend.compute_values(samples, micro_batch_size)
            case _TrainStep(samples, loss, global_batch_size, micro_batch_size, learning_rate):
                try:
                    return backend.train_step(samples, loss, global_batch_size, micro_batch_size, learning_rate)
                finally:
                    # the step's freed working set goes back to the kernel before the publish and the
                    # rollouts need memory (tcmalloc would keep it: tandem/host_memory.py)
                    release_free_memory()
            case _PublishWeights(group, version, detach):
                if detach or self._detached.holds(version):  # async GRPO, or a resend of its held copy
                    return self._detached.start(backend.iter_published_tensors() if not self._detached.holds(version)
                                                else iter(()), self._sender, group, version, self._plan)
                self._detached.forget()
                return publish_weights(backend.iter_published_tensors(), self._sender, group, version, self._plan)
            case _HoldWeights(version):
                return self._detached.hold(backend.iter_published_tensors(), version, self._plan)
            case _ExportCudaIpc(version):
                return self._ipc.export(version, self._plan, backend.iter_published_tensors(), leader=self.is_leader)
            case _ReleaseCudaIpc(version):
                return self._ipc.release(version)
            case _SaveCheckpoint(path, background):
                return backend.save_checkpoint(path, background=background)
            case _LoadCheckpoint(path):
                return backend.load_checkpoint(path)
            case _ExportHf(path, for_generators):
                state = backend.gather_hf_state_dict()
                backend.export_adapter(path / "adapter")  # LoRA: the adapters too
                if state is None:
                    return 0
                dtype = plan_dtype(self._plan) if for_generators else backend.checkpoint_dtype
                return write_hf_checkpoint(state, path, source_dir=self._model_name, dtype=dtype,
                                           config=head_config(self._model_name, self._head))
        raise TypeError(f"unknown command {type(command).__name__}")


def build_engine(settings: TrainerSettings, log: Any, token: str) -> TrainerEngine:
    """Join the torchrun world, load the backend, and (rank 0) start the weight-sync store.
    The run's `token` seals both stores (tandem/stores.py)."""
    env = init_distributed(settings.lockstep_timeout_s, secret=token)
    backend = build_backend(settings, env)
    plan = weight_sync_plan(settings, backend)
    sender, fingerprint = None, ""
    if env.rank == 0:
        sender = WeightSender(host=settings.weight_sync_host, device=env.device, secret=token)
        fingerprint = model_fingerprint(settings.model_name, backend.hf_tensor_shapes)
    decoder = None
    if settings.generation.enabled:
        decoder = Decoder(backend, eos_ids=eos_token_ids(settings.model_name),
                          max_num_seqs=settings.generation.max_num_seqs, group=env.cpu_group, rank=env.rank,
                          seed=settings.seed)
    log.info("trainer_ready", world_size=env.world_size, device=str(env.device),
             num_parameters=backend.num_parameters, plan_bytes=plan.total_bytes, serves_generation=decoder is not None)
    return TrainerEngine(backend, Lockstep(env.cpu_group, env.rank, env.world_size), model_name=settings.model_name,
                         plan=plan, sender=sender, fingerprint=fingerprint, log=log,
                         head=settings.model_head, decoder=decoder)


def writable_dir(path: str, what: str) -> Path:
    """The directory `path` names, made if missing; ValueError (the caller's mistake, not the
    trainer's) when it cannot be made or written."""
    if not path:
        raise ValueError(f"{what} path is empty")
    target = Path(path).expanduser().absolute()
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".tandem-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write the {what} to {target}: {exc.strerror or exc}") from None
    return target
