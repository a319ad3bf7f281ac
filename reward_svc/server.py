"""gRPC transport of the reward service: proto in, RewardEngine call, proto out."""

from __future__ import annotations

from protos.tandem.reward.v1 import reward_pb2 as pb
from protos.tandem.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_svc.engine import RewardEngine
from reward_svc.types import ScoreItem, StepItem, Turn

SERVICE_NAME = "tandem.reward.v1.RewardService"


class RewardServicer(pb_grpc.RewardServiceServicer):
    def __init__(self, engine: RewardEngine):
        self._engine = engine

    async def GetInfo(self, request: pb.GetInfoRequest, context) -> pb.GetInfoResponse:
        info = self._engine.info()
        return pb.GetInfoResponse(tasks=list(info.tasks), scorers=info.scorers,
                                  multi_turn_tasks=list(info.multi_turn_tasks))

    async def Score(self, request: pb.ScoreRequest, context) -> pb.ScoreResponse:
        items = [ScoreItem(i.task, i.prompt, i.completion, i.ground_truth) for i in request.items]
        results = await self._engine.score(items)
        return pb.ScoreResponse(results=[pb.ScoreResult(reward=r.reward, correct=r.correct) for r in results])

    async def Step(self, request: pb.StepRequest, context) -> pb.StepResponse:
        items = [StepItem(i.task, i.prompt, i.ground_truth, tuple(Turn(t.completion, t.observation) for t in i.history),
                          i.completion) for i in request.items]
        results = await self._engine.step(items)
        return pb.StepResponse(results=[pb.StepResult(done=r.done, observation=r.observation, reward=r.reward,
                                                      correct=r.correct) for r in results])


def add_to_server(servicer: RewardServicer, server) -> None:
    pb_grpc.add_RewardServiceServicer_to_server(servicer, server)
