"""Settings of one reward service process (its section of the experiment config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ScorerName = Literal["exact", "math", "code", "calculator", "reward_model"]
MULTI_TURN_SCORERS = frozenset({"calculator"})
"""Scorers whose episodes take several turns (the RewardService.Step protocol)."""

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

    model_name: str
    """Local checkpoint directory (or hub name already in the local cache): model and tokenizer."""
    batch_size: int = Field(16, ge=1)
    """Sequences per forward pass."""
    max_length: int = Field(512, ge=2)
    """Tokens per sequence (prompt + completion); longer ones lose their start (left truncation),
    so the score is still read at the completion's last token."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    squash: Literal["none", "sigmoid"] = "none"
    """none: the reward is the model's raw scalar; sigmoid: sigmoid(scalar), in (0, 1) (the
    Bradley-Terry probability of beating a zero-score answer). `correct` is scalar > 0 either way."""


class RewardSettings(BaseModel):
    """Which scorer serves which task, and how scoring runs."""

    model_config = ConfigDict(extra="forbid")

    tasks: dict[str, ScorerName] = Field(default_factory=lambda: {"arithmetic": "exact"})
    """Task name -> scorer. `exact`: the completion's first line equals the answer;
    `math`: math-verify equivalence (boxed, plain numbers, LaTeX); `code`: the fraction of the
    item's tests that the completion's Python passes, run in the sandbox; `calculator`: a
    multi-turn arithmetic task with a calculator tool (reward_svc/envs/calculator.py);
    `reward_model`: the scalar of a sequence-classification model over prompt + completion
    (settings `reward_model`; the ground truth is ignored)."""
    num_workers: int = Field(1, ge=1)
    """Worker processes that run the scorers (never the gRPC thread)."""
    item_timeout_s: float = Field(5.0, gt=0)
    """Per-item scoring time limit; an item over it scores 0 and its worker is killed and replaced."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of the code sandbox (used by `code` tasks)."""
    max_tool_calls: int = Field(2, ge=0)
    """`calculator` tasks: tool calls allowed per episode; one more ends it with reward 0."""
    reward_model: RewardModelSettings | None = None
    """The model of `reward_model` tasks (required by them); loaded once, in the service process."""

    @model_validator(mode="after")
    def _reward_model_configured(self) -> RewardSettings:
        if "reward_model" in self.tasks.values() and self.reward_model is None:
            tasks = sorted(t for t, s in self.tasks.items() if s == "reward_model")
            raise ValueError(f"tasks {tasks} use the reward_model scorer but reward_model (its model_name, "
                             "batch_size, max_length, dtype) is not set")
        return self

    @model_validator(mode="after")
    def _timeout_covers_sandbox(self) -> RewardSettings:
        needed = self.sandbox.wall_s + SANDBOX_STARTUP_MARGIN_S
        if "code" in self.tasks.values() and self.item_timeout_s <= needed:
            raise ValueError(f"item_timeout_s ({self.item_timeout_s}) must exceed sandbox.wall_s + "
                             f"{SANDBOX_STARTUP_MARGIN_S} = {needed}: raise item_timeout_s or lower sandbox.wall_s")
        return self
