"""The engine's worker pool: a job past its deadline gets its worker killed and replaced; a
scorer that raises or kills its worker costs one item; math and code items through the
engine, with pathological expressions that must not stall a batch."""

import asyncio
import json
import operator
import os
import subprocess
import sys
import time

import pytest
import structlog
from pydantic import ValidationError

from reward_svc.config import RewardSettings
from reward_svc.engine import RewardEngine
from reward_svc.types import ScoreItem
from reward_svc.workers import ScorerFailed, WorkerPool
from tests import procs


def test_stuck_worker_is_killed_and_replaced():
    async def scenario():
        pool = WorkerPool(2)
        await pool.wait_ready()
        pids_before = set(pool.pids)
        started = time.monotonic()
        stuck = asyncio.create_task(pool.run(time.sleep, (60,), timeout_s=1.0))  # uninterrupted, like C code
        # the other worker keeps scoring meanwhile
        assert [await pool.run(operator.add, (i, 1), timeout_s=5.0) for i in range(3)] == [1, 2, 3]
        with pytest.raises(TimeoutError):
            await stuck
        elapsed = time.monotonic() - started
        replaced = pids_before - set(pool.pids)
        assert elapsed < 3.0 and pool.num_replaced == 1 and len(replaced) == 1
        assert not procs.alive(replaced.pop())
        # both workers serve again (the replacement included)
        results = await asyncio.gather(*(pool.run(operator.mul, (i, 2), timeout_s=60.0) for i in range(4)))
        assert results == [0, 2, 4, 6]
        pool.close()
    asyncio.run(scenario())


def test_scorer_errors_and_dead_workers_cost_one_job():
    async def scenario():
        pool = WorkerPool(1)
        with pytest.raises(ScorerFailed, match="ValueError"):
            await pool.run(int, ("not a number",), timeout_s=60.0)
        with pytest.raises(ScorerFailed, match="died"):
            await pool.run(os._exit, (3,), timeout_s=60.0)
        assert await pool.run(operator.add, (2, 2), timeout_s=60.0) == 4
        assert pool.num_replaced == 1
        pool.close()
    asyncio.run(scenario())


def test_a_cancelled_caller_does_not_lose_the_worker():
    async def scenario():
        pool = WorkerPool(1)
        await pool.wait_ready()
        job = asyncio.create_task(pool.run(time.sleep, (0.5,), timeout_s=5.0))
        await asyncio.sleep(0.1)
        job.cancel()  # e.g. the gRPC client gave up
        assert await asyncio.wait_for(pool.run(operator.add, (1, 1), timeout_s=5.0), 10.0) == 2
        pool.close()
    asyncio.run(scenario())


def test_engine_scores_math_and_code_and_survives_pathological_items():
    settings = RewardSettings(tasks={"math": "math", "code": "code"}, num_workers=2, item_timeout_s=4.0,
                              sandbox={"cpu_s": 1, "wall_s": 2.0})
    tests = json.dumps({"tests": ["assert f(2) == 4", "assert f(3) == 9"], "entry_point": "f"})
    items = [ScoreItem("math", "q", r"\boxed{\frac{3}{4}}", "0.75"),
             ScoreItem("math", "q", r"\boxed{(10^{100000})!}", "2"),        # math-verify's own timeout
             ScoreItem("math", "q", r"\boxed{9^{9^{9^{9}}}}", "1"),
             ScoreItem("math", "q", "so 0.7", "3/4"),
             ScoreItem("code", "q", "def f(x):\n    return x * x", tests),
             ScoreItem("code", "q", "def f(x):\n    return 4", tests),
             ScoreItem("code", "q", "while True:\n    pass", tests),
             ScoreItem("code", "q", "def f(x): return x", "not json"),      # bad ground truth: 0, batch goes on
             ScoreItem("math", "q", "42", "")]                              # unparsable ground truth

    async def scenario():
        engine = RewardEngine(settings, structlog.get_logger())
        await engine.warm_up()
        started = time.monotonic()
        results = await engine.score(items)
        elapsed = time.monotonic() - started
        again = await engine.score(items[:1] + items[4:5])
        engine.close()
        return results, elapsed, again

    results, elapsed, again = asyncio.run(scenario())
    assert [r.reward for r in results] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    assert [r.correct for r in results] == [True, False, False, False, True, False, False, False, False]
    assert elapsed < 15.0, elapsed
    assert [r.correct for r in again] == [True, True]


_HAS_MATH_VERIFY = "'math_verify' in __import__('sys').modules"


@pytest.mark.parametrize(("tasks", "imported"), [({"sum": "exact"}, False), ({"sum": "exact", "proof": "math"}, True)])
def test_math_verify_is_imported_by_the_workers_of_a_service_with_a_math_task_only(tasks, imported):
    """math-verify (and sympy) cost ~0.9 CPU-s per process to import, paid while a run's other
    services start: a service without a math task never imports them."""
    async def scenario():
        engine = RewardEngine(RewardSettings(tasks=tasks, num_workers=1), structlog.get_logger())
        await engine.warm_up()
        try:
            return await engine._pool.run(eval, (_HAS_MATH_VERIFY,), timeout_s=60.0)
        finally:
            engine.close()

    assert asyncio.run(scenario()) is imported
    # nor does the service's own process, whatever its tasks
    check = f"import reward_svc.engine, reward_svc.server; assert not {_HAS_MATH_VERIFY}"
    subprocess.run([sys.executable, "-c", check], check=True)


def test_code_task_needs_an_item_timeout_above_the_sandbox_wall_clock():
    with pytest.raises(ValidationError, match="sandbox.wall_s"):
        RewardSettings(tasks={"code": "code"}, item_timeout_s=3.0, sandbox={"wall_s": 3.0})
    RewardSettings(tasks={"math": "math"}, item_timeout_s=3.0, sandbox={"wall_s": 3.0})  # no code task: fine


def test_a_stopping_engine_refuses_calls_as_unavailable_and_finishes_those_in_flight():
    """A reward service told to stop (a compose swap, a relaunch) must not answer INTERNAL: the
    coordinator ends the run on that, and retries elsewhere on UNAVAILABLE (ConnectionError)."""
    settings = RewardSettings(tasks={"arith": "math"}, num_workers=1)
    item = ScoreItem("arith", "2+2=", "4", "4")

    async def scenario():
        engine = RewardEngine(settings, structlog.get_logger())
        await engine.warm_up()
        in_flight = asyncio.create_task(engine.score([item] * 20))
        await asyncio.sleep(0)  # the call has started
        await engine.drain(timeout_s=60)
        assert [r.correct for r in await in_flight] == [True] * 20  # finished, not cut off
        with pytest.raises(ConnectionError, match="stopping"):
            await engine.score([item])
        engine.close()
        with pytest.raises(ConnectionError, match="stopping"):
            await engine.step([])
    asyncio.run(scenario())


def test_a_job_the_closing_pool_cuts_off_is_unavailable_not_an_item_that_failed():
    """Before: the killed worker counted as the item's failure (scored 0) and was replaced."""
    async def scenario():
        pool = WorkerPool(1)
        await pool.wait_ready()
        job = asyncio.create_task(pool.run(time.sleep, (30,), timeout_s=60.0))
        waiting = asyncio.create_task(pool.run(operator.add, (1, 1), timeout_s=60.0))
        await asyncio.sleep(0.5)
        pool.close()
        with pytest.raises(ConnectionError, match="stopping"):
            await asyncio.wait_for(job, 10)
        assert pool.num_replaced == 0
        with pytest.raises(ConnectionError, match="stopping"):
            await pool.run(operator.add, (1, 1), timeout_s=60.0)
        waiting.cancel()  # it waits for a worker that never comes back: the server's stop cancels it
    asyncio.run(scenario())
