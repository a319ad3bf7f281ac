"""gRPC transport of the trainer (rank 0 only): proto in, engine call, proto out.

Engine calls run one at a time on a single worker thread (they are lockstep commands that
every rank must see in the same order) so the event loop stays free for health checks.
A trainer that serves generation itself (settings.generation.enabled) also serves the
generator contract on the same port, with the contract's shared servicer (tandem.generation.servicer) over
`trainer_svc.generation`, and registers as a generator sharing the trainer's weights.
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from protos.tandem.trainer.v1 import trainer_pb2 as pb
from protos.tandem.trainer.v1 import trainer_pb2_grpc as pb_grpc
from tandem import service
from tandem.convert import enum_from_pb, from_pb, group_from_pb, plan_to_pb, to_pb
from tandem.generation import servicer as generator_contract
from tandem.kinds import ServiceKind
from tandem.membership import Announcement, Load
from tandem.rpc import start_server
from trainer_svc.config import ModelHead, TrainerSettings
from trainer_svc.engine import TrainerEngine
from trainer_svc.generation import TrainerGenerationEngine
from trainer_svc.types import LOSSES, LossConfig, Sample, loss_kind_named

SERVICE_NAME = "tandem.trainer.v1.TrainerService"


def _sample(s: pb.Sample) -> Sample:
    return Sample(tuple(s.token_ids), s.prompt_length, tuple(s.loss_mask) or None,
                  tuple(s.generation_logprobs) or None, s.advantage, tuple(s.teacher_logprobs) or None,
                  tuple(s.token_advantages) or None, tuple(s.returns) or None, tuple(s.values) or None,
                  tuple(s.routed_experts) or None)


def _loss(request: pb.TrainStepRequest) -> LossConfig:
    name = request.WhichOneof("loss")
    if name is None:
        raise ValueError(f"TrainStepRequest.loss is not set ({', '.join(k.name for k in LOSSES)})")
    config = loss_kind_named(name).config
    return config(**from_pb(getattr(request, name), config))


def _policy(request: pb.ComputeLogprobsRequest) -> str:
    policy = enum_from_pb(pb.PolicyKind.DESCRIPTOR, request.policy)
    if policy is None:
        raise ValueError("ComputeLogprobsRequest.policy must be CURRENT or REFERENCE")
    return policy


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, engine: TrainerEngine, executor: ThreadPoolExecutor):
        self._engine = engine
        self._executor = executor

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def GetInfo(self, request, context):
        info = self._engine.info()
        return to_pb(pb.GetInfoResponse, info, bucket_plan=plan_to_pb(info.bucket_plan))

    async def ComputeLogprobs(self, request, context):
        rows = await self._call(self._engine.logprobs, [_sample(s) for s in request.samples], _policy(request),
                                request.micro_batch_size)
        return pb.ComputeLogprobsResponse(samples=[pb.TokenLogprobs(logprobs=r) for r in rows])

    async def ComputeValues(self, request, context):
        rows = await self._call(self._engine.values, [_sample(s) for s in request.samples], request.micro_batch_size)
        return pb.ComputeValuesResponse(samples=[pb.TokenValues(values=r) for r in rows])

    async def TrainStep(self, request, context):
        learning_rate = request.learning_rate if request.HasField("learning_rate") else None
        result = await self._call(self._engine.train_step, [_sample(s) for s in request.samples], _loss(request),
                                  request.global_batch_size, request.micro_batch_size, learning_rate)
        return pb.TrainStepResponse(metrics=result.metrics, global_step=result.global_step)

    async def PublishWeights(self, request, context):
        group = group_from_pb(request.group)
        if self._engine.holds(request.version):  # a held copy is sent beside the engine's work (a train step)
            result = await asyncio.to_thread(self._engine.publish_held, group, request.version)
        else:
            result = await self._call(self._engine.publish_weights, group, request.version, request.detach)
        return pb.PublishWeightsResponse(bytes_sent=result.bytes_sent, duration_ms=result.duration_ms)

    async def HoldWeights(self, request, context):
        result = await self._call(self._engine.hold_weights, request.version)
        return pb.HoldWeightsResponse(num_bytes=result.bytes_sent, duration_ms=result.duration_ms)

    async def SaveCheckpoint(self, request, context):
        return pb.SaveCheckpointResponse(duration_ms=await self._call(self._engine.save_checkpoint, request.path,
                                                                      request.background))

    async def CheckpointWritten(self, request, context):  # beside the engine's work, like a held publish
        return pb.CheckpointWrittenResponse(written=await asyncio.to_thread(
            self._engine.checkpoint_written, request.path, request.timeout_s))

    async def LoadCheckpoint(self, request, context):
        return pb.LoadCheckpointResponse(global_step=await self._call(self._engine.load_checkpoint, request.path))

    async def ExportHf(self, request, context):
        return pb.ExportHfResponse(num_tensors=await self._call(self._engine.export_hf, request.path,
                                                                request.for_generators))

    async def ExportCudaIpcWeights(self, request, context):
        result = await self._call(self._engine.export_cuda_ipc, request.version)
        return pb.ExportCudaIpcWeightsResponse(buckets=result.buckets, num_bytes=result.num_bytes,
                                               duration_ms=result.duration_ms)

    async def ReleaseCudaIpcWeights(self, request, context):
        return pb.ReleaseCudaIpcWeightsResponse(released=await self._call(self._engine.release_cuda_ipc, request.version))


async def serve(engine: TrainerEngine, settings: TrainerSettings, args: argparse.Namespace, token: str,
                log: Any, executor: ThreadPoolExecutor) -> int:
    """Serve until SIGTERM/SIGINT, running the engine's work on `executor` (one thread: the one that
    built the engine); in-flight engine work finishes before this returns. The exit code is
    tandem.service.serve's."""
    servicer = TrainerServicer(engine, executor)
    register, names = [lambda s: pb_grpc.add_TrainerServiceServicer_to_server(servicer, s)], [SERVICE_NAME]
    generator = generator_contract.GeneratorServicer(log)
    if engine.serves_generation:
        generator.engine = TrainerGenerationEngine.build(engine, settings, executor)
        register.append(lambda s: generator_contract.add_to_server(generator, s))
        names.append(generator_contract.SERVICE_NAME)
    running = generator.running = await start_server(register, names, host=args.host, port=args.port, token=token,
                                                     log=log)
    address = f"{args.advertise_host or args.host}:{running.port}"
    fingerprint = engine.info().model_fingerprint
    also = []
    if generator.engine is not None:
        info = generator.engine.info
        also.append((Announcement(ServiceKind.GENERATOR, address, fingerprint, capacity=settings.generation.max_num_seqs,
                                  shares_trainer_weights=True),
                     lambda: Load(num_inflight=info().num_running, weight_version=info().weight_version)))
    kind = ServiceKind.CRITIC if settings.model_head is ModelHead.TOKEN_VALUE else ServiceKind.TRAINER
    return await service.serve(running, args, Announcement(kind, address, fingerprint),
                               lambda: Load(weight_version=engine.weight_version), log, also=also)
