"""RewardEngine.step: the calculator environment over several turns in the worker pool, and
single-turn tasks ending at their first turn."""

import asyncio

import structlog

from reward_svc.config import RewardSettings
from reward_svc.engine import RewardEngine
from reward_svc.types import StepItem, StepResult, Turn


def test_engine_steps_calculator_episodes_and_single_turn_tasks():
    async def scenario():
        engine = RewardEngine(RewardSettings(tasks={"calc": "calculator", "exact": "exact"}, max_tool_calls=1),
                              structlog.get_logger())
        await engine.warm_up()
        try:
            assert engine.info().multi_turn_tasks == ("calc",)
            first = StepItem("calc", "12+34=", "46", (), "?")
            answered = StepItem("calc", "12+34=", "46", (Turn("?", "46\n"),), "46")
            again = StepItem("calc", "12+34=", "46", (Turn("?", "46\n"),), "?")
            single = StepItem("exact", "1+1=", "2", (), "2")
            results = await engine.step([first, answered, again, single])
            assert results == [StepResult(done=False, observation="46\n"), StepResult(True, "", 1.0, True),
                               StepResult(True, "", 0.0, False), StepResult(True, "", 1.0, True)]
            # Score on a calculator task: the completion as a final answer (validation without the tool)
            from reward_svc.types import ScoreItem
            assert [r.correct for r in await engine.score([ScoreItem("calc", "12+34=", "46", "46")])] == [True]
        finally:
            engine.close()
    asyncio.run(scenario())
