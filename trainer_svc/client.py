"""Typed synchronous client of the trainer service (what the coordinator and tests use).

Protos stay inside this module: callers pass and get the plain types of `trainer_svc.types`
and `tandem.weight_sync`. Every call has a deadline: `call_timeout_s` for quick calls,
`long_call_timeout_s` for training, scoring, publishing and checkpoint I/O. Failures raise
`tandem.rpc.RpcFailure` with the server's status.
"""

from __future__ import annotations

from collections.abc import Sequence

from protos.tandem.trainer.v1 import trainer_pb2 as pb
from protos.tandem.trainer.v1 import trainer_pb2_grpc as pb_grpc
from tandem.convert import enum_to_pb, from_pb, group_to_pb, plan_from_pb, to_pb
from tandem.rpc import open_channel, rpc_failures
from tandem.weight_plan import GroupSpec
from trainer_svc.config import TrainingBackend
from trainer_svc.types import (
    CudaIpcExport,
    LossConfig,
    Policy,
    PublishResult,
    Sample,
    StepResult,
    TrainerInfo,
    loss_kind,
)


def _sample_pb(s: Sample) -> pb.Sample:
    return pb.Sample(token_ids=list(s.token_ids), prompt_length=s.prompt_length, loss_mask=list(s.loss_mask or ()),
                     generation_logprobs=list(s.generation_logprobs or ()), advantage=s.advantage,
                     teacher_logprobs=list(s.teacher_logprobs or ()), token_advantages=list(s.token_advantages or ()),
                     returns=list(s.returns or ()), values=list(s.values or ()),
                     routed_experts=list(s.routed_experts or ()))


def _train_request(loss: LossConfig, **fields) -> pb.TrainStepRequest:
    """A TrainStepRequest with `loss` in its oneof (the field its registered kind names)."""
    try:
        name = loss_kind(loss).name
    except ValueError as exc:
        raise TypeError(str(exc)) from None
    message = getattr(pb, pb.TrainStepRequest.DESCRIPTOR.fields_by_name[name].message_type.name)
    return pb.TrainStepRequest(**fields, **{name: to_pb(message, loss)})


class TrainerClient:
    """One channel to a trainer's rank 0."""

    def __init__(self, address: str, token: str | None, *, call_timeout_s: float = 30.0,
                 long_call_timeout_s: float = 3600.0):
        self.address = address
        self._channel = open_channel(address, token)
        self._stub = pb_grpc.TrainerServiceStub(self._channel)
        self._short = call_timeout_s
        self._long = long_call_timeout_s

    @rpc_failures
    def info(self) -> TrainerInfo:
        r = self._stub.GetInfo(pb.GetInfoRequest(), timeout=self._short)
        values = from_pb(r, skip=("bucket_plan",))
        return TrainerInfo(**{**values, "backend": TrainingBackend(values["backend"])},
                           bucket_plan=plan_from_pb(r.bucket_plan))

    @rpc_failures
    def logprobs(self, samples: Sequence[Sample], policy: Policy = "current",
                 micro_batch_size: int = 8) -> list[list[float]]:
        """Completion-token logprobs per sample: logprobs[i] = log p(token_ids[P+i] | token_ids[:P+i])."""
        request = pb.ComputeLogprobsRequest(samples=[_sample_pb(s) for s in samples],
                                            policy=enum_to_pb(pb.PolicyKind.DESCRIPTOR, policy),
                                            micro_batch_size=micro_batch_size)
        reply = self._stub.ComputeLogprobs(request, timeout=self._long)
        return [list(row.logprobs) for row in reply.samples]

    @rpc_failures
    def values(self, samples: Sequence[Sample], micro_batch_size: int = 8) -> list[list[float]]:
        """A PPO critic's value of each completion token's state: values[i] is its value of
        token_ids[:P+i], from which token P+i was sampled."""
        request = pb.ComputeValuesRequest(samples=[_sample_pb(s) for s in samples], micro_batch_size=micro_batch_size)
        reply = self._stub.ComputeValues(request, timeout=self._long)
        return [list(row.values) for row in reply.samples]

    @rpc_failures
    def train_step(
self, samples: Sequence[Sample], loss: LossConfig, *, global_batch_size: int,
                   micro_batch_size: int, learning_rate: float | None = None) -> StepResult:
        request = _train_request(loss, samples=[_sample_pb(s) for s in samples], global_batch_size=global_batch_size,
                                 micro_batch_size=micro_batch_size, learning_rate=learning_rate)
        reply = self._stub.TrainStep(request, timeout=self._long)
        return StepResult(dict(reply.metrics), reply.global_step)

    @rpc_failures
    def publish_weights(self, group: GroupSpec, version: int, detach: bool = False) -> PublishResult:
        """detach: return once the trainer holds its copy of `version` (the broadcast goes on)."""
        reply = self._stub.PublishWeights(pb.PublishWeightsRequest(group=group_to_pb(group), version=version,
                                                                   detach=detach),
                                          timeout=self._long)
        return PublishResult(reply.bytes_sent, reply.duration_ms)

    @rpc_failures
    def hold_weights(self, version: int) -> PublishResult:
        """Async GRPO: the trainer copies its weights as `version` and may train on; a later
        publish_weights of that version broadcasts the copy (its bytes_sent: what that will send)."""
        reply = self._stub.HoldWeights(pb.HoldWeightsRequest(version=version), timeout=self._long)
        return PublishResult(reply.num_bytes, reply.duration_ms)

    @rpc_failures
    def export_cuda_ipc(self, version: int) -> CudaIpcExport:
        """Colocated on GPUs: CUDA IPC handles of the current weights' buckets, held by the
        trainer until `release_cuda_ipc(version)`."""
        reply = self._stub.ExportCudaIpcWeights(pb.ExportCudaIpcWeightsRequest(version=version), timeout=self._long)
        return CudaIpcExport(version, tuple(reply.buckets), reply.num_bytes, reply.duration_ms)

    @rpc_failures
    def release_cuda_ipc(self, version: int) -> bool:
        """Let the trainer free an export once every generator has read it; whether it was held."""
        return self._stub.ReleaseCudaIpcWeights(pb.ReleaseCudaIpcWeightsRequest(version=version),
                                                timeout=self._long).released

    @rpc_failures
    def save_checkpoint(self, path: str, *, background: bool = False) -> int:
        """Returns the save's wall time in milliseconds. With `background` it returns once the
        write has started: the checkpoint is complete once `checkpoint_written` returns True."""
        return self._stub.SaveCheckpoint(pb.SaveCheckpointRequest(path=path, background=background),
                                         timeout=self._long).duration_ms

    @rpc_failures
    def checkpoint_written(self, path: str, timeout_s: float) -> bool:
        """Waits up to timeout_s for a background save to be on disk and marked complete; whether it is."""
        return self._stub.CheckpointWritten(pb.CheckpointWrittenRequest(path=path, timeout_s=timeout_s),
                                            timeout=timeout_s + 30.0).written

    @rpc_failures
    def load_checkpoint(self, path: str) -> int:
        """Returns the restored global step."""
        return self._stub.LoadCheckpoint(pb.LoadCheckpointRequest(path=path), timeout=self._long).global_step

    @rpc_failures
    def export_hf(self, path: str, *, for_generators: bool = False) -> int:
        """Returns the number of tensors written; for_generators: in the dtype they serve, not the checkpoint's."""
        return self._stub.ExportHf(pb.ExportHfRequest(path=path, for_generators=for_generators),
                                   timeout=self._long).num_tensors

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
