"""Agents in the environment service (reward_svc/agents.py): how an episode ends, the time and
concurrency limits, and RunEpisode over gRPC (an agent that blocks its loop never starves the
service). The episodes' model calls through a real gateway: tests/unit/coordinator/loop/test_gateway.py."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager

import pytest
import structlog
from pydantic import ValidationError

from reward_svc.agents import EpisodeRunner, end_reason
from reward_svc.client import RewardClient
from reward_svc.config import AgentSettings, RewardSettings
from reward_svc.engine import RewardEngine
from reward_svc.envs.judge import UnparsableJudgement
from reward_svc.server import SERVICE_NAME, RewardServicer, add_to_server
from reward_svc.types import EpisodeEnd, EpisodeRequest
from tandem.rpc import RpcFailure, Status, start_server

LOG = structlog.get_logger()
RUNNING = {"now": 0, "most": 0}


async def rewarded(example, client):
    return 1.0 if example["answer"] == "2" else 0.0, {"turn_rewards": [0.25, 0.75], "seen": client.api_key,
                                                       "url": str(client.base_url), "odd": {1, 2}}


async def sleeps(example, client):
    await asyncio.sleep(30)


async def raises(example, client):
    raise KeyError("tool crashed")


async def own_timeout(example, client):
    raise TimeoutError("my tool's own timeout")  # not the episode's limit: an error of the agent


async def returns_bool(example, client):
    return True


async def bad_turn_rewards(example, client):
    return 1.0, {"turn_rewards": [1.0, float("inf")]}


async def counted(example, client):
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    await asyncio.sleep(0.4)
    RUNNING["now"] -= 1
    return 1.0


async def blocks(example, client):
    time.sleep(2.0)  # blocks the agents' loop, not the service's
    return 0.5


def agent(fn, **limits) -> AgentSettings:
    return AgentSettings(function=f"{__name__}.{fn.__name__}", **limits)


def request(task="t", answer="2") -> EpisodeRequest:
    return EpisodeRequest(task, {"prompt": "1+1", "answer": answer, "task": task}, "http://127.0.0.1:9/v1", "ep-key")


def run(runner: EpisodeRunner, *requests: EpisodeRequest):
    async def all_of():
        return await asyncio.gather(*(runner.run(r) for r in requests))
    return asyncio.run(all_of())


@pytest.mark.parametrize(("fn", "end", "error"), [
    (sleeps, EpisodeEnd.TIMEOUT, "ran past its time limit of 0.2 s (env.t.agent.timeout_s)"),
    (raises, EpisodeEnd.ERROR, "KeyError('tool crashed')"),
    (own_timeout, EpisodeEnd.ERROR, "my tool's own timeout"),
    (returns_bool, EpisodeEnd.BAD_RETURN, "returns a number"),
    (bad_turn_rewards, EpisodeEnd.BAD_RETURN, "finite numbers as turn_rewards; got inf")])
def test_an_episode_without_a_reward_ends_with_its_reason_and_never_raises(fn, end, error):
    runner = EpisodeRunner({"t": agent(fn, timeout_s=0.2)}, LOG)
    (result,) = run(runner, request())
    runner.close()
    assert (result.end, result.reward, result.correct) == (end, 0.0, False)
    assert error in result.info["error"]


def test_a_reward_comes_back_with_its_turn_rewards_and_info_as_json():
    runner = EpisodeRunner({"t": agent(rewarded)}, LOG)
    right, wrong = run(runner, request(), request(answer="3"))
    runner.close()
    assert (right.end, right.reward, right.correct, right.turn_rewards) == (EpisodeEnd.REWARDED, 1.0, True, (0.25, 0.75))
    assert (wrong.reward, wrong.correct) == (0.0, False)
    assert right.info["seen"] == "ep-key" and right.info["url"] == "http://127.0.0.1:9/v1/"
    assert right.info["odd"] == "{1, 2}"  # what JSON cannot hold travels as its repr


def test_at_most_max_concurrency_episodes_run_at_once_and_the_limit_counts_from_the_start():
    RUNNING.update(now=0, most=0)
    runner = EpisodeRunner({"t": agent(counted, max_concurrency=2, timeout_s=1.0)}, LOG)
    results = run(runner, *[request() for _ in range(6)])  # 3 waves of 0.4 s: none times out waiting
    runner.close()
    assert RUNNING["most"] == 2 and [r.end for r in results] == [EpisodeEnd.REWARDED] * 6


def test_end_reasons_follow_the_gateway_status_through_wrapping():
    import httpx
    import openai

    def status(code):
        response = httpx.Response(code, request=httpx.Request("POST", "http://x/v1/chat/completions"))
        return openai.APIStatusError("refused", response=response, body=None)

    def wrapped(inner):
        try:
            raise RuntimeError("my loop gave up") from inner
        except RuntimeError as exc:
            return exc

    assert end_reason(wrapped(status(400))) is EpisodeEnd.REFUSED_CALL
    assert end_reason(status(503)) is EpisodeEnd.NO_GENERATOR
    assert end_reason(wrapped(UnparsableJudgement("no score", "hm"))) is EpisodeEnd.JUDGE_UNPARSABLE
    assert end_reason(status(500)) is EpisodeEnd.ERROR


def test_settings_refuse_an_agent_that_does_not_import_and_a_task_both_scored_and_an_agents():
    with pytest.raises(ValidationError, match="agents.t: agent function 'nope.episode': module 'nope' does not import"):
        RewardSettings(tasks={}, agents={"t": AgentSettings(function="nope.episode")})
    with pytest.raises(ValidationError, match=r"tasks \['t'\] are both scored"):
        RewardSettings(tasks={"t": "exact"}, agents={"t": agent(rewarded)})
    settings = RewardSettings(tasks={"s": "exact"}, agents={"t": agent(rewarded)})
    assert settings.all_tasks == ["s", "t"]
    assert RewardSettings(agents={"t": agent(rewarded)}).all_tasks == ["t"]  # no default scored task then
    assert RewardSettings().all_tasks == ["arithmetic"]


@contextmanager
def serving(settings: RewardSettings):
    """The reward service's engine behind its gRPC server, on a loop thread of this process."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = RewardEngine(settings, LOG)

    async def up():
        running = await start_server([lambda s: add_to_server(RewardServicer(engine), s)], [SERVICE_NAME],
                                     host="127.0.0.1", port=0, token="secret", log=LOG)
        await engine.warm_up()
        await running.mark_ready()
        return running

    running = asyncio.run_coroutine_threadsafe(up(), loop).result(30)
    client = RewardClient(running.address, "secret")
    try:
        yield client
    finally:
        client.close()
        asyncio.run_coroutine_threadsafe(running.stop(grace_s=0.5), loop).result(10)
        engine.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_run_episode_over_grpc_and_an_agent_that_blocks_its_loop_never_starves_the_service():
    settings = RewardSettings(tasks={}, agents={"t": agent(rewarded), "slow": agent(blocks, timeout_s=5)})
    with serving(settings) as client:
        info = client.info()
        assert (info.tasks, info.agent_tasks, info.multi_turn_tasks) == (("slow", "t"), ("slow", "t"), ())
        result = client.run_episode(request(), timeout_s=10)
        assert (result.end, result.reward, result.turn_rewards, result.info["seen"]) == (
            EpisodeEnd.REWARDED, 1.0, (0.25, 0.75), "ep-key")
        slow = threading.Thread(target=lambda: client.run_episode(request("slow"), timeout_s=10))
        slow.start()
        time.sleep(0.3)
        client.info()
        assert slow.is_alive()  # answered while the slow agent still blocks its own loop
        slow.join(10)
        with pytest.raises(RpcFailure) as refused:
            client.run_episode(request("other"), timeout_s=10)
        assert refused.value.status is Status.INVALID_ARGUMENT and "has no agent here" in str(refused.value)
