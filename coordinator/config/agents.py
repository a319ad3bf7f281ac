"""`env.<task>.agent`: a task whose episodes are user code, an agent written against the OpenAI
client (coordinator/loop/gateway/). The function is imported at config load, so a path that
does not import is a config error that names it."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field, PrivateAttr, model_validator

from coordinator.config.section import Section


@dataclass(frozen=True)
class AgentEnv:
    """The resolved environment: `await fn(example, client)` runs one episode and returns its
    reward (a number), or (reward, info) where info may hold `correct` (bool)."""

    path: str
    fn: Callable


class AgentConfig(Section):
    function: str
    """Dotted path of the environment: `package.module.episode` (or `package.module:episode`), an
    `async def episode(example, client) -> float` where example is a dict (prompt, answer, task)
    and client an `openai.AsyncOpenAI` pointed at the run's rollout gateway with the episode's key."""
    timeout_s: float = Field(120.0, gt=0)
    """Wall-clock limit of one episode; past it the episode ends with reward 0 (counted as
    agent/ended_timeout and agent/agent_timeouts), never the run."""
    max_concurrency: int = Field(64, ge=1)
    """Episodes running at once (each holds at most one model call at a time)."""
    _env: AgentEnv | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _import(self) -> AgentConfig:
        self._env = AgentEnv(self.function, load_agent(self.function))
        return self

    @property
    def env(self) -> AgentEnv:
        assert self._env is not None
        return self._env


def load_agent(path: str) -> Callable:
    """The async function at `path` (module.attr or module:attr); ValueError saying what is wrong."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"agent function {path!r} must be a dotted path such as my_pkg.agents.episode")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"agent function {path!r}: module {module_name!r} does not import ({exc}); check the path "
                         "and that the module is on PYTHONPATH") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"agent function {path!r}: module {module_name!r} has no {attr!r}")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"agent function {path!r} must be an async function: async def {attr}(example, client)")
    return fn
