"""`env.<task>`: the reward service of one task. Its scoring settings are reward_svc's own
(`ScoringSettings`, the schema the service validates); the coordinator adds what only it uses."""

from __future__ import annotations

from pydantic import Field, model_validator

from reward_svc.config import AgentSettings, Scorer, ScoringSettings


class EnvConfig(ScoringSettings):
    """One task's reward service. `reward_model.model_name` unset (scorer reward_model): the
    embedded tiny reward model (coordinator/embedded/reward_model.py)."""

    scorer: Scorer = Scorer.EXACT
    """exact: first line equals the answer; math: math-verify; code: sandboxed test cases;
    calculator: a multi-turn tool environment; reward_model: a sequence-classification model's
    scalar (env.<task>.reward_model)."""
    max_turns: int = Field(4, ge=1)
    """Multi-turn scorers (calculator): most model turns per episode; then it ends, truncated."""
    external: bool = False
    """Served by a reward service that someone else starts (the Python API's reward_fn, or one you
    run yourself with --coordinator): local launch starts none for this task and waits for one to register."""

    agent: AgentSettings | None = None
    """Episodes of this task are an agent's: user code against the OpenAI client, run by the task's
    environment service (a reward service with `agents`: reward_svc/agents.py) against the run's
    rollout gateway (coordinator/loop/gateway/); the agent's return value is the reward and `scorer`
    is not used. Its path is imported at config load (unless `external`: then only the service that
    someone else runs imports it). Unset: the task is scored by its reward service."""

    @property
    def served_by_agent(self) -> bool:
        """The task's episodes and rewards come from its agent, not from a scorer."""
        return self.agent is not None

    @model_validator(mode="after")
    def _scorer_settings(self) -> EnvConfig:
        self._check_scorers({self.scorer})
        if self.agent is not None and not self.external:
            self.agent.load()  # a path that does not import is a config error that names it
        return self
