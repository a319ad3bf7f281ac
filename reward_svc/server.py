"""gRPC transport of the reward service: proto in, RewardEngine call, proto out."""

from __future__ import annotations

import json

from protos.tandem.reward.v1 import reward_pb2 as pb
from protos.tandem.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_svc.engine import RewardEngine
from reward_svc.types import EpisodeEnd, EpisodeRequest, ScoreItem, StepItem, Turn

SERVICE_NAME = "tandem.reward.v1.RewardService"


class RewardServicer(pb_grpc.RewardServiceServicer):
    def __init__(self, engine: RewardEngine):
        self._engine = engine

    async def GetInfo(self, request: pb.GetInfoRequest, context) -> pb.GetInfoResponse:
        info = self._engine.info()
        return pb.GetInfoResponse(tasks=list(info.tasks), scorers=info.scorers,
                                  multi_turn_tasks=list(info.multi_turn_tasks), agent_tasks=list(info.agent_tasks))

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

    async def RunEpisode(self, request: pb.RunEpisodeRequest, context) -> pb.RunEpisodeResponse:
        example = {"prompt": request.prompt, "answer": request.ground_truth, "task": request.task}
        r = await self._engine.run_episode(EpisodeRequest(request.task, example, request.base_url, request.api_key))
        return pb.RunEpisodeResponse(end=_END_TO_PB[r.end], reward=r.reward, correct=r.correct,
                                     turn_rewards=list(r.turn_rewards), info_json=json.dumps(r.info))


_END_TO_PB = {end: pb.EpisodeEnd.Value(f"EPISODE_END_{end.name}") for end in EpisodeEnd
              if end is not EpisodeEnd.SERVICE_LOST}  # SERVICE_LOST: the coordinator's, never sent


def add_to_server(servicer: RewardServicer, server) -> None:
    pb_grpc.add_RewardServiceServicer_to_server(servicer, server)
