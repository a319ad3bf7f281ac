"""gRPC transport of the trainer (rank 0 only): proto in, engine call, proto out.

Engine calls run one at a time on a single worker thread (they are lockstep commands that
every rank must see in the same order) so the event loop stays free for health checks.
A trainer that serves generation itself (settings.generation.enabled) also serves the
generator contract on the same port, with the generator's own servicer over
`trainer_svc.generation`, and registers as a generator sharing the trainer's weights.
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from generator_svc.server import SERVICE_NAME as GENERATOR_SERVICE_NAME
from generator_svc.server import GeneratorServicer
from protos.tandem.generator.v1 import generator_pb2_grpc as generator_pb_grpc
from protos.tandem.trainer.v1 import trainer_pb2 as pb
from protos.tandem.trainer.v1 import trainer_pb2_grpc as pb_grpc
from tandem.convert import group_from_pb, plan_to_pb
from tandem import service
from tandem.membership import Announcement, Load
from tandem.rpc import start_server
from trainer_svc.config import TrainerSettings
from trainer_svc.engine import TrainerEngine
from trainer_svc.generation import TrainerGenerationEngine
from trainer_svc.types import (
    BradleyTerryLossConfig,
    DpoLossConfig,
    GrpoLossConfig,
    LossConfig,
    NllLossConfig,
    Sample,
)

SERVICE_NAME = "tandem.trainer.v1.TrainerService"
_POLICIES = {pb.POLICY_KIND_CURRENT: "current", pb.POLICY_KIND_REFERENCE: "reference"}
_BACKENDS = {"dtensor": pb.BACKEND_DTENSOR, "megatron": pb.BACKEND_MEGATRON}
_KL_TYPES = {pb.KL_TYPE_UNSPECIFIED: "k3", pb.KL_TYPE_K1: "k1", pb.KL_TYPE_K2: "k2", pb.KL_TYPE_K3: "k3"}
_TIS_TYPES = {pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_UNSPECIFIED: "tis", pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_TIS: "tis",
              pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_ICEPOP: "icepop",
              pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_SEQ_MASK_TIS: "seq-mask-tis"}


def _sample(s: pb.Sample) -> Sample:
    return Sample(tuple(s.token_ids), s.prompt_length, tuple(s.loss_mask) or None,
                  tuple(s.generation_logprobs) or None, s.advantage)


def _loss(request: pb.TrainStepRequest) -> LossConfig:
    match request.WhichOneof("loss"):
        case "grpo":
            return _grpo_loss(request.grpo)
        case "nll":
            return NllLossConfig()
        case "dpo":
            d = request.dpo
            return DpoLossConfig(d.reference_policy_kl_penalty, d.preference_loss_weight, d.sft_loss_weight,
                                 d.preference_average_log_probs, d.sft_average_log_probs)
        case "bradley_terry":
            return BradleyTerryLossConfig()
    raise ValueError("TrainStepRequest.loss is not set (grpo, nll, dpo or bradley_terry)")


def _grpo_loss(g: pb.GrpoLoss) -> GrpoLossConfig:
    def opt(name: str) -> float | None:
        return getattr(g, name) if g.HasField(name) else None

    if g.reference_policy_kl_type not in _KL_TYPES or g.truncated_importance_sampling_type not in _TIS_TYPES:
        raise ValueError("GrpoLoss: unknown reference_policy_kl_type or truncated_importance_sampling_type")
    return GrpoLossConfig(
        g.ratio_clip_min, g.ratio_clip_max, g.reference_policy_kl_penalty, g.use_importance_sampling_correction,
        ratio_clip_c=opt("ratio_clip_c"), reference_policy_kl_type=_KL_TYPES[g.reference_policy_kl_type],
        kl_input_clamp_value=opt("kl_input_clamp_value"), kl_output_clamp_value=opt("kl_output_clamp_value"),
        use_on_policy_kl_approximation=g.use_on_policy_kl_approximation, token_level_loss=not g.sequence_level_loss,
        sequence_level_importance_ratios=g.sequence_level_importance_ratios,
        truncated_importance_sampling_ratio=opt("truncated_importance_sampling_ratio"),
        truncated_importance_sampling_type=_TIS_TYPES[g.truncated_importance_sampling_type],
        truncated_importance_sampling_ratio_min=opt("truncated_importance_sampling_ratio_min"),
        disable_ppo_ratio=g.disable_ppo_ratio, force_on_policy_ratio=g.force_on_policy_ratio)


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, engine: TrainerEngine, executor: ThreadPoolExecutor):
        self._engine = engine
        self._executor = executor

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def GetInfo(self, request, context):
        info = self._engine.info()
        return pb.GetInfoResponse(
            model_name=info.model_name, model_fingerprint=info.model_fingerprint, backend=_BACKENDS[info.backend],
            world_size=info.world_size, device_type=info.device_type,
            weight_sync_store_address=info.weight_sync_store_address, bucket_plan=plan_to_pb(info.bucket_plan),
            num_parameters=info.num_parameters, global_step=info.global_step)

    async def ComputeLogprobs(self, request, context):
        if request.policy not in _POLICIES:
            raise ValueError("ComputeLogprobsRequest.policy must be CURRENT or REFERENCE")
        rows = await self._call(self._engine.logprobs, [_sample(s) for s in request.samples],
                                _POLICIES[request.policy], request.micro_batch_size)
        return pb.ComputeLogprobsResponse(samples=[pb.TokenLogprobs(logprobs=r) for r in rows])

    async def TrainStep(self, request, context):
        learning_rate = request.learning_rate if request.HasField("learning_rate") else None
        result = await self._call(self._engine.train_step, [_sample(s) for s in request.samples], _loss(request),
                                  request.global_batch_size, request.micro_batch_size, learning_rate)
        return pb.TrainStepResponse(metrics=result.metrics, global_step=result.global_step)

    async def PublishWeights(self, request, context):
        result = await self._call(self._engine.publish_weights, group_from_pb(request.group), request.version)
        return pb.PublishWeightsResponse(bytes_sent=result.bytes_sent, duration_ms=result.duration_ms)

    async def SaveCheckpoint(self, request, context):
        return pb.SaveCheckpointResponse(duration_ms=await self._call(self._engine.save_checkpoint, request.path))

    async def LoadCheckpoint(self, request, context):
        return pb.LoadCheckpointResponse(global_step=await self._call(self._engine.load_checkpoint, request.path))

    async def ExportHf(self, request, context):
        return pb.ExportHfResponse(num_tensors=await self._call(self._engine.export_hf, request.path))

    async def ExportCudaIpcWeights(self, request, context):
        result = await self._call(self._engine.export_cuda_ipc, request.version)
        return pb.ExportCudaIpcWeightsResponse(buckets=result.buckets, num_bytes=result.num_bytes,
                                               duration_ms=result.duration_ms)

    async def ReleaseCudaIpcWeights(self, request, context):
        return pb.ReleaseCudaIpcWeightsResponse(released=await self._call(self._engine.release_cuda_ipc, request.version))


async def serve(engine: TrainerEngine, settings: TrainerSettings, args: argparse.Namespace, token: str,
                log: Any) -> None:
    """Serve until SIGTERM/SIGINT; in-flight engine work finishes before this returns."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-engine")
    servicer = TrainerServicer(engine, executor)
    register, names = [lambda s: pb_grpc.add_TrainerServiceServicer_to_server(servicer, s)], [SERVICE_NAME]
    generator = GeneratorServicer(log)
    if engine.serves_generation:
        generator.engine = TrainerGenerationEngine.build(engine, settings, executor)
        register.append(lambda s: generator_pb_grpc.add_GeneratorServiceServicer_to_server(generator, s))
        names.append(GENERATOR_SERVICE_NAME)
    running = generator.running = await start_server(register, names, host=args.host, port=args.port, token=token,
                                                     log=log)
    address = f"{args.advertise_host or args.host}:{running.port}"
    fingerprint = engine.info().model_fingerprint
    also = []
    if generator.engine is not None:
        info = generator.engine.info
        also.append((Announcement("generator", address, fingerprint, capacity=settings.generation.max_num_seqs,
                                  shares_trainer_weights=True),
                     lambda: Load(num_inflight=info().num_running, weight_version=info().weight_version)))
    try:
        await service.serve(running, args, Announcement("trainer", address, fingerprint),
                            lambda: Load(weight_version=engine.weight_version), log, also=also)
    finally:
        executor.shutdown(wait=True)
