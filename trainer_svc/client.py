"""Typed synchronous client of the trainer service (what the coordinator and tests use).

Protos stay inside this module: callers pass and get the plain types of `trainer_svc.types`
and `tandem.weight_sync`. Every call has a deadline: `call_timeout_s` for quick calls,
`long_call_timeout_s` for training, scoring, publishing and checkpoint I/O. Failures raise
`grpc.RpcError` with the server's status code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from protos.tandem.trainer.v1 import trainer_pb2 as pb
from protos.tandem.trainer.v1 import trainer_pb2_grpc as pb_grpc
from tandem.convert import group_to_pb, plan_from_pb
from tandem.rpc import open_channel
from tandem.weight_sync import GroupSpec
from trainer_svc.types import (
    BradleyTerryLossConfig,
    CudaIpcExport,
    DpoLossConfig,
    GrpoLossConfig,
    LossConfig,
    NllLossConfig,
    Policy,
    PublishResult,
    Sample,
    StepResult,
    TrainerInfo,
)

_POLICIES = {"current": pb.POLICY_KIND_CURRENT, "reference": pb.POLICY_KIND_REFERENCE}
_BACKENDS = {pb.BACKEND_DTENSOR: "dtensor", pb.BACKEND_MEGATRON: "megatron"}
_KL_TYPES = {"k1": pb.KL_TYPE_K1, "k2": pb.KL_TYPE_K2, "k3": pb.KL_TYPE_K3}
_TIS_TYPES = {"tis": pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_TIS, "icepop": pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_ICEPOP,
              "seq-mask-tis": pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_SEQ_MASK_TIS}


def _sample_pb(s: Sample) -> pb.Sample:
    return pb.Sample(token_ids=list(s.token_ids), prompt_length=s.prompt_length, loss_mask=list(s.loss_mask or ()),
                     generation_logprobs=list(s.generation_logprobs or ()), advantage=s.advantage)


def _grpo_loss_pb(loss: GrpoLossConfig) -> pb.GrpoLoss:
    return pb.GrpoLoss(
        ratio_clip_min=loss.ratio_clip_min, ratio_clip_max=loss.ratio_clip_max,
        reference_policy_kl_penalty=loss.reference_policy_kl_penalty,
        use_importance_sampling_correction=loss.use_importance_sampling_correction,
        ratio_clip_c=loss.ratio_clip_c, reference_policy_kl_type=_KL_TYPES[loss.reference_policy_kl_type],
        kl_input_clamp_value=loss.kl_input_clamp_value, kl_output_clamp_value=loss.kl_output_clamp_value,
        use_on_policy_kl_approximation=loss.use_on_policy_kl_approximation,
        sequence_level_loss=not loss.token_level_loss,
        sequence_level_importance_ratios=loss.sequence_level_importance_ratios,
        truncated_importance_sampling_ratio=loss.truncated_importance_sampling_ratio,
        truncated_importance_sampling_type=_TIS_TYPES[loss.truncated_importance_sampling_type],
        truncated_importance_sampling_ratio_min=loss.truncated_importance_sampling_ratio_min,
        disable_ppo_ratio=loss.disable_ppo_ratio, force_on_policy_ratio=loss.force_on_policy_ratio)


class TrainerClient:
    """One channel to a trainer's rank 0."""

    def __init__(self, address: str, token: str | None, *, call_timeout_s: float = 30.0,
                 long_call_timeout_s: float = 3600.0):
        self.address = address
        self._channel = open_channel(address, token)
        self._stub = pb_grpc.TrainerServiceStub(self._channel)
        self._short = call_timeout_s
        self._long = long_call_timeout_s

    def info(self) -> TrainerInfo:
        r = self._stub.GetInfo(pb.GetInfoRequest(), timeout=self._short)
        return TrainerInfo(model_name=r.model_name, model_fingerprint=r.model_fingerprint,
                           backend=_BACKENDS.get(r.backend, "dtensor"), world_size=r.world_size,
                           device_type=r.device_type, weight_sync_store_address=r.weight_sync_store_address,
                           bucket_plan=plan_from_pb(r.bucket_plan), num_parameters=r.num_parameters,
                           global_step=r.global_step)

    def logprobs(self, samples: Sequence[Sample], policy: Policy = "current",
                 micro_batch_size: int = 8) -> list[list[float]]:
        """Completion-token logprobs per sample: logprobs[i] = log p(token_ids[P+i] | token_ids[:P+i])."""
        request = pb.ComputeLogprobsRequest(samples=[_sample_pb(s) for s in samples], policy=_POLICIES[policy],
                                            micro_batch_size=micro_batch_size)
        reply = self._stub.ComputeLogprobs(request, timeout=self._long)
        return [list(row.logprobs) for row in reply.samples]

    def train_step(self, samples: Sequence[Sample], loss: LossConfig, *, global_batch_size: int,
                   micro_batch_size: int, learning_rate: float | None = None) -> StepResult:
        request = pb.TrainStepRequest(samples=[_sample_pb(s) for s in samples], global_batch_size=global_batch_size,
                                      micro_batch_size=micro_batch_size, learning_rate=learning_rate)
        match loss:
            case GrpoLossConfig():
                request.grpo.CopyFrom(_grpo_loss_pb(loss))
            case NllLossConfig():
                request.nll.SetInParent()
            case DpoLossConfig():
                request.dpo.CopyFrom(pb.DpoLoss(**dataclasses.asdict(loss)))
            case BradleyTerryLossConfig():
                request.bradley_terry.SetInParent()
            case _:
                raise TypeError(f"unknown loss config {type(loss).__name__}")
        reply = self._stub.TrainStep(request, timeout=self._long)
        return StepResult(dict(reply.metrics), reply.global_step)

    def publish_weights(self, group: GroupSpec, version: int) -> PublishResult:
        reply = self._stub.PublishWeights(pb.PublishWeightsRequest(group=group_to_pb(group), version=version),
                                          timeout=self._long)
        return PublishResult(reply.bytes_sent, reply.duration_ms)

    def export_cuda_ipc(self, version: int) -> CudaIpcExport:
        """Colocated on GPUs: CUDA IPC handles of the current weights' buckets, held by the
        trainer until `release_cuda_ipc(version)`."""
        reply = self._stub.ExportCudaIpcWeights(pb.ExportCudaIpcWeightsRequest(version=version), timeout=self._long)
        return CudaIpcExport(version, tuple(reply.buckets), reply.num_bytes, reply.duration_ms)

    def release_cuda_ipc(self, version: int) -> bool:
        """Let the trainer free an export once every generator has read it; whether it was held."""
        return self._stub.ReleaseCudaIpcWeights(pb.ReleaseCudaIpcWeightsRequest(version=version),
                                                timeout=self._long).released

    def save_checkpoint(self, path: str) -> int:
        """Returns the save's wall time in milliseconds."""
        return self._stub.SaveCheckpoint(pb.SaveCheckpointRequest(path=path), timeout=self._long).duration_ms

    def load_checkpoint(self, path: str) -> int:
        """Returns the restored global step."""
        return self._stub.LoadCheckpoint(pb.LoadCheckpointRequest(path=path), timeout=self._long).global_step

    def export_hf(self, path: str) -> int:
        """Returns the number of tensors written."""
        return self._stub.ExportHf(pb.ExportHfRequest(path=path), timeout=self._long).num_tensors

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
