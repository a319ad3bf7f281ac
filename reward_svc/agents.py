"""Agents in the environment service: each episode is `await fn(example, client)` with an
`openai.AsyncOpenAI` client whose base URL is the run's rollout gateway (owned by the coordinator,
which records every model call of the episode as tokens) and whose API key is the episode's.

The agents run on an event loop of their own, in a thread of the service, so an agent that blocks
its loop never starves the service's gRPC server (health, other calls). Per task, at most
`max_concurrency` episodes run at once (more wait for a slot), each within `timeout_s` counted from
its start. A tool that executes code runs it in the sandbox (reward_svc/sandbox `run_program`;
examples/agents/math_python_agent.py), in this service's process tree.

An agent that raises, times out or returns something other than a reward ends its episode with a
counted reason (`EpisodeEnd`), never the service or the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import threading

from reward_svc.config import AgentSettings
from reward_svc.envs.judge import UnparsableJudgement
from reward_svc.types import EpisodeEnd, EpisodeRequest, EpisodeResult


class BadReturn(TypeError):
    """An agent returned something that is not a reward."""


class EpisodeRunner:
    """Runs the episodes of the agents named in the service's settings (`agents`)."""

    def __init__(self, agents: dict[str, AgentSettings], log):
        self._settings = dict(agents)
        self._fns = {task: agent.load() for task, agent in agents.items()}
        self._log = log
        self._loop = asyncio.new_event_loop()
        self._slots = {task: asyncio.Semaphore(agent.max_concurrency) for task, agent in agents.items()}
        self._thread = threading.Thread(target=self._loop.run_forever, name="agents", daemon=True)
        self._thread.start()
        self.running = 0
        """Episodes running now (not those waiting for a slot)."""

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted(self._settings))

    def max_timeout_s(self) -> float:
        """The longest episode time limit of this service's agents (its drain waits that long)."""
        return max((a.timeout_s for a in self._settings.values()), default=0.0)

    async def run(self, request: EpisodeRequest) -> EpisodeResult:
        """One episode, run on the agents' loop; awaitable from any loop (a cancelled caller
        cancels the episode)."""
        if request.task not in self._fns:
            raise ValueError(f"task {request.task!r} has no agent here; this service runs agents for {list(self.tasks)}")
        future = asyncio.run_coroutine_threadsafe(self._episode(request), self._loop)
        return await asyncio.wrap_future(future)

    async def _episode(self, request: EpisodeRequest) -> EpisodeResult:
        import openai

        settings = self._settings[request.task]
        async with self._slots[request.task]:
            self.running += 1
            client = openai.AsyncOpenAI(base_url=request.base_url, api_key=request.api_key, max_retries=0,
                                        timeout=settings.timeout_s)
            try:
                async with asyncio.timeout(settings.timeout_s) as limit:
                    returned = await self._fns[request.task](dict(request.example), client)
                return rewarded(returned)
            except Exception as exc:  # noqa: BLE001 (user code: any failure ends the episode, never the service)
                if isinstance(exc, TimeoutError) and limit.expired():
                    result = EpisodeResult(EpisodeEnd.TIMEOUT, info={
                        "error": f"the episode ran past its time limit of {settings.timeout_s} s "
                                 f"(env.{request.task}.agent.timeout_s)"})
                else:
                    result = EpisodeResult(end_reason(exc), info={"error": repr(exc)[:2000]})
                self._log.warning("agent_episode_failed", task=request.task, reason=result.end.value,
                                  error=result.info["error"][:500])
                return result
            finally:
                self.running -= 1
                await client.close()

    def close(self) -> None:
        """Cancel the episodes still running and stop the agents' loop."""
        if not self._thread.is_alive():
            return

        def cancel_all() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_soon(self._loop.stop)

        self._loop.call_soon_threadsafe(cancel_all)
        self._thread.join(timeout=5)


def rewarded(returned) -> EpisodeResult:
    """What an agent returned as a result: a finite number, or (number, dict) where the dict may hold
    `correct` and `turn_rewards`; BadReturn otherwise."""
    if isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], dict):
        reward, info = returned
    else:
        reward, info = returned, {}
    _check_number(reward, "a reward")
    turn_rewards = info.get("turn_rewards", ())
    if not isinstance(turn_rewards, list | tuple):
        raise BadReturn(f"info['turn_rewards'] is a list of numbers (one per model turn); got {type(turn_rewards).__name__}")
    for value in turn_rewards:
        _check_number(value, "turn_rewards")
    plain = json.loads(json.dumps(info, default=repr))  # what travels back (JSON), whatever the agent put in it
    return EpisodeResult(EpisodeEnd.REWARDED, float(reward), bool(info.get("correct", reward > 0)),
                         tuple(float(v) for v in turn_rewards), plain)


def _check_number(value, what: str) -> None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise BadReturn(f"an agent returns a number (or (number, dict)) as {what}; got {type(value).__name__}")
    if not math.isfinite(value):
        raise BadReturn(f"an agent returns finite numbers as {what}; got {value}")


def end_reason(exc: BaseException) -> EpisodeEnd:
    """The reason an agent's exception ends its episode: a model call the gateway refused or could
    not serve (the openai client's status errors, also when the agent wrapped them), else its own."""
    import openai

    if isinstance(exc, BadReturn):
        return EpisodeEnd.BAD_RETURN
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, UnparsableJudgement):
            return EpisodeEnd.JUDGE_UNPARSABLE
        if isinstance(exc, openai.APIStatusError):
            if exc.status_code == 503:
                return EpisodeEnd.NO_GENERATOR
            if 400 <= exc.status_code < 500:
                return EpisodeEnd.REFUSED_CALL
        exc = exc.__cause__ or exc.__context__
    return EpisodeEnd.ERROR
