"""Typed client of the reward service; returns plain dataclasses."""

from __future__ import annotations

import json

from protos.tandem.reward.v1 import reward_pb2 as pb
from protos.tandem.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_svc.types import (
    EpisodeEnd,
    EpisodeRequest,
    EpisodeResult,
    RewardInfo,
    ScoreItem,
    ScoreResult,
    StepItem,
    StepResult,
)
from tandem.rpc import open_channel, rpc_failures


class RewardClient:
    def __init__(self, address: str, token: str | None, timeout_s: float = 60.0):
        self.address = address
        self._channel = open_channel(address, token)
        self._stub = pb_grpc.RewardServiceStub(self._channel)
        self._timeout_s = timeout_s

    @rpc_failures
    def info(self) -> RewardInfo:
        reply = self._stub.GetInfo(pb.GetInfoRequest(), timeout=10.0)
        return RewardInfo(tasks=tuple(reply.tasks), scorers=dict(reply.scorers),
                          multi_turn_tasks=tuple(reply.multi_turn_tasks), agent_tasks=tuple(reply.agent_tasks))

    @rpc_failures
    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        request = pb.ScoreRequest(items=[pb.ScoreItem(task=i.task, prompt=i.prompt, completion=i.completion,
                                                      ground_truth=i.ground_truth) for i in items])
        reply = self._stub.Score(request, timeout=self._timeout_s)
        return [ScoreResult(reward=r.reward, correct=r.correct) for r in reply.results]

    @rpc_failures
    def step(self, items: list[StepItem]) -> list[StepResult]:
        """Advance each episode by one turn (RewardService.Step)."""
        request = pb.StepRequest(items=[
            pb.StepItem(task=i.task, prompt=i.prompt, ground_truth=i.ground_truth, completion=i.completion,
                        history=[pb.Turn(completion=t.completion, observation=t.observation) for t in i.history])
            for i in items])
        reply = self._stub.Step(request, timeout=self._timeout_s)
        return [StepResult(done=r.done, observation=r.observation, reward=r.reward, correct=r.correct)
                for r in reply.results]

    @rpc_failures
    def run_episode(self, request: EpisodeRequest, timeout_s: float) -> EpisodeResult:
        """Run one agent episode (RewardService.RunEpisode); blocks until it ended, at most
        timeout_s (the agent's limit plus a grace: the service ends the episode itself first)."""
        reply = self._stub.RunEpisode(pb.RunEpisodeRequest(
            task=request.task, prompt=request.example.get("prompt", ""), ground_truth=request.example.get("answer", ""),
            base_url=request.base_url, api_key=request.api_key), timeout=timeout_s)
        end = pb.EpisodeEnd.Name(reply.end).removeprefix("EPISODE_END_").lower()
        return EpisodeResult(EpisodeEnd(end), reply.reward, reply.correct, tuple(reply.turn_rewards),
                             json.loads(reply.info_json or "{}"))

    def close(self) -> None:
        self._channel.close()
