"""VllmEngine.drain around the swap gate (the vLLM engine itself is not needed for this part;
the real drain runs in tests/integration/test_elastic.py)."""

import asyncio

import pytest
import structlog

from generator_svc.config import GeneratorSettings
from generator_svc.engines.vllm_engine import VllmEngine
from tandem.generation.types import SamplingConfig


def _engine() -> VllmEngine:
    return VllmEngine(object(), GeneratorSettings(model_name="unused"), "test", structlog.get_logger())


def test_drain_waits_for_the_calls_in_flight_then_refuses_new_ones():
    async def scenario():
        engine = _engine()
        release = asyncio.Event()

        async def call_in_flight():
            async with engine._gate.call():
                await release.wait()

        task = asyncio.create_task(call_in_flight())
        await asyncio.sleep(0.01)
        drain = asyncio.create_task(engine.drain(timeout_s=30))
        await asyncio.sleep(0.2)
        assert not drain.done()  # still waiting for the call
        with pytest.raises(ConnectionError, match="leaving"):
            async for _ in engine.generate([[1]], SamplingConfig(n=1, temperature=1.0, max_tokens=1)):
                pass
        release.set()
        assert await drain is True
        await task

    asyncio.run(scenario())


def test_drain_gives_up_after_its_timeout():
    async def scenario():
        engine = _engine()
        never = asyncio.Event()

        async def stuck():
            async with engine._gate.call():
                await never.wait()

        task = asyncio.create_task(stuck())
        await asyncio.sleep(0.01)
        assert await engine.drain(timeout_s=0.2) is False
        task.cancel()

    asyncio.run(scenario())
