"""Agent episodes spread over a task's environment services (coordinator/loop/gateway/agents.py):
at most max_concurrency per service, the least busy first; a service lost mid-episode costs the
episode a re-run from its start (its partial record discarded), never the run; past MAX_RERUNS it
ends as service_lost; with no live service the run waits for one. The services are fakes here;
the real ones run in tests/integration/test_agent_gateway.py."""

from __future__ import annotations

import threading
import time

import pytest

from coordinator.data.examples import Example
from coordinator.loop.gateway.agents import MAX_RERUNS, Environments, outcome_metrics, run_agents
from coordinator.loop.gateway.service import RolloutGateway
from reward_svc.config import AgentSettings
from reward_svc.types import EpisodeEnd, EpisodeResult
from tandem.rpc import RpcFailure, Status

AGENT = AgentSettings(function="json.decoder.JSONDecoder.decode", max_concurrency=2, timeout_s=5)  # never loaded


class FakeEnvironment:
    """RunEpisode's face: reward 1 after a short while, or fails with `status` its first `failures` calls."""

    def __init__(self, name: str, failures: int = 0, status: Status = Status.UNAVAILABLE):
        self.name, self.failures, self.status = name, failures, status
        self.calls, self.now, self.most, self.keys = 0, 0, 0, []
        self._lock = threading.Lock()

    def run_episode(self, request, timeout_s):
        with self._lock:
            self.calls += 1
            self.now += 1
            self.most = max(self.most, self.now)
            self.keys.append(request.api_key)
            failing = self.failures > 0
            self.failures -= failing
        try:
            if failing:
                raise RpcFailure(self.status, f"{self.name} was killed")
            time.sleep(0.05)
            return EpisodeResult(EpisodeEnd.REWARDED, 1.0, True, info={"by": self.name})
        finally:
            with self._lock:
                self.now -= 1


def examples(n: int) -> list[Example]:
    return [Example(f"{i}+1", str(i + 1), "agent", (1,)) for i in range(n)]


def rollout(live: list, n: int, *, drop_failed: bool = True, wait=time.sleep, per_example: int = 2):
    gateway = RolloutGateway(None, None)
    failed = []

    def on_failure(client, exc):
        failed.append(client.name)
        if drop_failed and client in live:
            live.remove(client)

    environments = Environments("agent", lambda: list(live), on_failure=on_failure, wait=wait, poll_s=0.01)
    outcomes = run_agents(gateway, "http://gateway/v1", "agent", AGENT, environments, examples(n), per_example)
    return outcomes, failed, gateway


def test_a_service_lost_mid_episode_costs_a_rerun_on_a_live_one_never_the_run():
    dying, good = FakeEnvironment("dying", failures=99), FakeEnvironment("good")
    outcomes, failed, gateway = rollout([dying, good], 4)
    flat = [o for group in outcomes for o in group]
    assert [o.reason for o in flat] == [None] * 8 and all(o.info == {"by": "good"} for o in flat)
    assert failed and set(failed) == {"dying"} and dying.calls == len(failed)
    counts = outcome_metrics(outcomes)
    assert counts["episodes_rerun"] == dying.calls and counts["agent_errors"] == 0
    assert not gateway._episodes  # every episode, the discarded attempts too, was closed
    assert len(set(dying.keys) & set(good.keys)) == 0  # a re-run is a fresh episode with its own key


def test_an_episode_whose_services_keep_dying_ends_as_service_lost():
    cursed = FakeEnvironment("cursed", failures=MAX_RERUNS + 1)
    outcomes, failed, _ = rollout([cursed], 1, drop_failed=False, per_example=1)
    (lost,) = outcomes[0]
    assert lost.reason is EpisodeEnd.SERVICE_LOST and failed == ["cursed"] * (MAX_RERUNS + 1)
    assert lost.reward == 0.0 and lost.reruns == MAX_RERUNS and "were lost 3 times" in lost.info["error"]
    counts = outcome_metrics(outcomes)
    assert (counts["ended_service_lost"], counts["agent_errors"]) == (1, 1)


def test_episodes_spread_over_the_live_services_at_most_max_concurrency_each():
    a, b = FakeEnvironment("a"), FakeEnvironment("b")
    outcomes, failed, _ = rollout([a, b], 8)  # 16 episodes
    assert not failed and a.calls + b.calls == 16 and a.calls and b.calls
    assert a.most <= AGENT.max_concurrency and b.most <= AGENT.max_concurrency


def test_with_no_live_service_the_run_waits_for_one_and_a_stopping_run_stops_waiting():
    live, waits = [], []

    def wait(seconds):
        waits.append(seconds)
        if len(waits) == 3:
            live.append(FakeEnvironment("late"))

    outcomes, _, _ = rollout(live, 1, wait=wait)
    assert len(waits) >= 3 and [o.reason for o in outcomes[0]] == [None, None]

    class Stopped(Exception):
        pass

    def stopping(seconds):
        raise Stopped
    with pytest.raises(Stopped):
        rollout([], 1, wait=stopping)


def test_a_request_the_service_refuses_is_raised_not_retried():
    refusing = FakeEnvironment("refusing", failures=9, status=Status.INVALID_ARGUMENT)
    with pytest.raises(RpcFailure, match="refusing was killed"):
        rollout([refusing], 1)
