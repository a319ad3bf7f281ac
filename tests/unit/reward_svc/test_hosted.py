"""A Python reward function served as a reward service (reward_svc/hosted.py)."""

import asyncio
import threading

import pytest

from reward_svc.client import RewardClient
from reward_svc.hosted import FunctionEnv, FunctionRewardService
from reward_svc.types import ScoreItem, StepItem
from tandem.logs import configure_logging


def test_scores_off_the_event_loop_and_steps_single_turn():
    threads = []

    def fn(prompt, completion, answer):
        threads.append(threading.current_thread().name)
        return 1.0 if completion == answer else 0.0

    env = FunctionEnv("custom", fn)

    async def go():
        scored = await env.score([ScoreItem("custom", "1+1=", "2", "2"), ScoreItem("custom", "1+1=", "3", "2")])
        stepped = await env.step([StepItem("custom", "1+1=", "2", (), "2")])
        return scored, stepped, threading.current_thread().name

    scored, stepped, loop_thread = asyncio.run(go())
    env.close()
    assert [(r.reward, r.correct) for r in scored] == [(1.0, True), (0.0, False)]
    assert stepped[0].done and stepped[0].reward == 1.0 and stepped[0].correct
    assert threads and loop_thread not in threads
    assert env.info().tasks == ("custom",)


@pytest.mark.parametrize("fn, message", [
    (lambda p, c, a: 1 / 0, "reward_fn raised ZeroDivisionError"),
    (lambda p, c, a: "high", "must return a finite float, got 'high'"),
    (lambda p, c, a: float("nan"), "must return a finite float"),
])
def test_bad_reward_functions_fail_with_the_item_named(fn, message):
    env = FunctionEnv("custom", fn)
    with pytest.raises(ValueError, match=message):
        asyncio.run(env.score([ScoreItem("custom", "p", "c", "a")]))
    with pytest.raises(ValueError, match="not served here"):
        asyncio.run(env.score([ScoreItem("other", "p", "c", "a")]))
    env.close()


def test_served_over_grpc_from_a_background_thread():
    service = FunctionRewardService("custom", lambda p, c, a: float(len(c)), configure_logging("test"))
    service.start("127.0.0.1:1", "secret")  # nothing listens there: membership just retries
    try:
        client = RewardClient(service.address, "secret")
        results = client.score([ScoreItem("custom", "p", "abc", "x")])
        assert results[0].reward == 3.0 and results[0].correct
        client.close()
    finally:
        service.stop()
    service.stop()  # idempotent
