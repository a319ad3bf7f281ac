"""Settings of one reward service process (its section of the experiment config)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Scorer(str, Enum):
    """What scores a task's completions (the engine builds one scorer object per task from it)."""

    EXACT = "exact"
    """The completion's first line equals the answer."""
    MATH = "math"
    """math-verify equivalence (boxed, plain numbers, LaTeX)."""
    CODE = "code"
    """The fraction of the item's tests that the completion's Python passes, run in the sandbox."""
    CALCULATOR = "calculator"
    """A multi-turn arithmetic task with a calculator tool (reward_svc/envs/calculator.py)."""
    REWARD_MODEL = "reward_model"
    """The scalar of a sequence-classification model over prompt + completion (the ground truth is ignored)."""

    @property
    def multi_turn(self) -> bool:
        """Episodes take several turns (the RewardService.Step protocol)."""
        return self is Scorer.CALCULATOR

    @property
    def needs_model(self) -> bool:
        """Scores with a model loaded in the service (settings `reward_model`)."""
        return self is Scorer.REWARD_MODEL

# What the sandbox needs beyond its wall clock: two interpreter starts, namespace setup, teardown.
SANDBOX_STARTUP_MARGIN_S = 1.0


class SandboxLimits(BaseModel):
    """Limits of one sandboxed program run (one code item). See reward_svc/sandbox/."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(2, ge=1)
    """RLIMIT_CPU: CPU seconds of each process in the sandbox (SIGXCPU, then SIGKILL)."""
    wall_s: float = Field(3.0, gt=0)
    """Wall-clock limit of the whole run; then every process in the sandbox is killed."""
    memory_bytes: int = Field(256 << 20, ge=64 << 20)
    """RLIMIT_AS: address space of each process."""
    max_processes: int = Field(16, ge=2)
    """RLIMIT_NPROC for the run's own uid: processes and threads together."""
    file_size_bytes: int = Field(1 << 20, ge=0)
    """RLIMIT_FSIZE: the largest file a process may write (SIGXFSZ past it)."""
    open_files: int = Field(64, ge=16)
    """RLIMIT_NOFILE: open file descriptors per process."""
    tmpfs_bytes: int = Field(8 << 20, ge=1 << 20)
    """Size of the private working directory (/tmp, a tmpfs that dies with the run)."""
    tmpfs_inodes: int = Field(256, ge=16)
    """Files and directories the working directory can hold."""
    output_bytes: int = Field(64 << 10, ge=1024)
    """Captured stdout+stderr kept per run; the rest is read and dropped."""


class RewardModelSettings(BaseModel):
    """A Hugging Face sequence-classification model with one scalar output (`num_labels=1`),
    served as the `reward_model` scorer (reward_svc/envs/reward_model.py)."""

    model_config = ConfigDict(extra="forbid")

    model_name: str | None = None
    """Local checkpoint directory (or hub name already in the local cache): model and tokenizer.
    Required by the service; a coordinator fills an unset one with its embedded tiny reward model."""
    batch_size: int = Field(16, ge=1)
    """Sequences per forward pass."""
    max_length: int = Field(512, ge=2)
    """Tokens per sequence (prompt + completion); longer ones lose their start (left truncation),
    so the score is still read at the completion's last token."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """dtype the model is loaded and run in."""
    squash: Literal["none", "sigmoid"] = "none"
    """none: the reward is the model's raw scalar; sigmoid: sigmoid(scalar), in (0, 1) (the
    Bradley-Terry probability of beating a zero-score answer). `correct` is scalar > 0 either way."""


class AgentSettings(BaseModel):
    """A task whose episodes are user code: an agent written against the OpenAI client, run by the
    environment service (reward_svc/agents.py) against the run's rollout gateway."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    function: str
    """Dotted path of the agent: `package.module.episode` (or `package.module:episode`), an
    `async def episode(example, client)` where example is a dict (prompt, answer, task) and client an
    `openai.AsyncOpenAI` pointed at the run's rollout gateway with the episode's key. It returns the
    reward (a number), or (reward, info): info may hold `correct` (bool) and `turn_rewards` (a number
    per model turn, reported; the trainer uses the reward). The module must import where the run is
    configured (checked at config load) and in the environment service (its PYTHONPATH)."""
    timeout_s: float = Field(120.0, gt=0)
    """Wall-clock limit of one episode, counted in the environment service from the episode's start;
    past it the episode ends with reward 0 (counted as agent/ended_timeout), never the run."""
    max_concurrency: int = Field(64, ge=1)
    """Episodes running at once in each environment service of the task (more wait for a slot; the
    coordinator sends each service at most this many)."""

    def load(self) -> Callable:
        """The agent function (ValueError saying what is wrong with the path)."""
        return load_agent(self.function)


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


class ScoringSettings(BaseModel):
    """How a reward service scores (the coordinator's `env.<task>` sections extend this class)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    num_workers: int = Field(1, ge=1)
    """Worker processes that run the scorers (never the gRPC thread)."""
    item_timeout_s: float = Field(5.0, gt=0)
    """Per-item scoring time limit; an item over it scores 0 and its worker is killed and replaced."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of the code sandbox (used by `code` tasks)."""
    max_tool_calls: int = Field(2, ge=0)
    """`calculator` tasks: tool calls allowed per episode; one more ends it with reward 0."""
    reward_model: RewardModelSettings = Field(default_factory=RewardModelSettings)
    """The model of `reward_model` tasks; loaded once, in the service process."""

    def _check_scorers(self, scorers: set[Scorer]) -> None:
        needed = self.sandbox.wall_s + SANDBOX_STARTUP_MARGIN_S
        if Scorer.CODE in scorers and self.item_timeout_s <= needed:
            raise ValueError(f"item_timeout_s ({self.item_timeout_s}) must exceed sandbox.wall_s + "
                             f"{SANDBOX_STARTUP_MARGIN_S} = {needed}: raise item_timeout_s or lower sandbox.wall_s")


class RewardSettings(ScoringSettings):
    """Which scorer serves which task, and how scoring runs."""

    tasks: dict[str, Scorer] = Field(default_factory=lambda: {"arithmetic": Scorer.EXACT})
    """Task name -> scorer (see Scorer); unset with `agents` set: none (an environment service only)."""
    agents: dict[str, AgentSettings] = Field(default_factory=dict)
    """Task name -> the agent that runs its episodes (RewardService.RunEpisode); each path is
    imported when the settings load, so a service whose agent does not import refuses to start."""

    @property
    def all_tasks(self) -> list[str]:
        """The tasks this service serves (announced to the coordinator): scored ones and agents'."""
        return sorted({*self.tasks, *self.agents})

    @model_validator(mode="before")
    @classmethod
    def _agents_only(cls, data):
        if isinstance(data, dict) and data.get("agents") and "tasks" not in data:
            data = {**data, "tasks": {}}  # settings naming only agents serve no scored task
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RewardSettings:
        both = sorted(set(self.tasks) & set(self.agents))
        if both:
            raise ValueError(f"tasks {both} are both scored (tasks) and run by an agent (agents): keep one")
        if not self.tasks and not self.agents:
            raise ValueError("a reward service serves at least one task: set tasks or agents")
        for task, agent in self.agents.items():
            try:
                agent.load()
            except ValueError as exc:
                raise ValueError(f"agents.{task}: {exc}") from None
        scorers = set(self.tasks.values())
        self._check_scorers(scorers)
        if any(s.needs_model for s in scorers) and self.reward_model.model_name is None:
            tasks = sorted(t for t, s in self.tasks.items() if s.needs_model)
            raise ValueError(f"tasks {tasks} use the reward_model scorer but reward_model.model_name is not set")
        return self
