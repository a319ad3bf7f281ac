"""The experiment configuration: one YAML file in NeMo-RL's schema, plus dotted overrides.

Parsed once into pydantic models that forbid unknown keys, so a typo is an error naming the
key. Sections: policy.* (config_policy.py), dpo.* and rm.* (config_preference.py), grpo.*,
sft.*, loss_fn.*, data.*, env.*, cluster.*, checkpointing.*, logger.*. Each service later gets only its own section (see launcher.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from coordinator.config_policy import (
    PolicyConfig,
    TrainingBackend,
)
from coordinator.config_preference import (
    Algorithm,
    DPOConfig,
    RMConfig,
    resolve_algorithm,
)
from reward_svc.config import SandboxLimits, ScorerName
from trainer_svc.types import GrpoLossConfig


class ConfigError(ValueError):
    """A user's configuration mistake; the message says which key and what to change."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LossConfig(_Section):
    reference_policy_kl_penalty: float = Field(0.0, ge=0)
    ratio_clip_min: float = Field(0.2, ge=0)
    ratio_clip_max: float = Field(0.2, ge=0)
    use_importance_sampling_correction: bool = True
    token_level_loss: bool = True
    """True: token mean over the global batch. False: per-sequence token mean, then mean over sequences."""
    ratio_clip_c: float | None = Field(None, gt=1)
    """Dual-clip constant for negative advantages (usually 3); null: off."""
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    kl_input_clamp_value: float | None = Field(20.0, gt=0)
    kl_output_clamp_value: float | None = Field(10.0, gt=0)
    use_on_policy_kl_approximation: bool = False
    sequence_level_importance_ratios: bool = False
    """GSPO's per-sequence ratio; needs token_level_loss: false."""
    truncated_importance_sampling_ratio: float | None = Field(None, gt=0)
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] = "tis"
    truncated_importance_sampling_ratio_min: float | None = Field(None, ge=0)
    disable_ppo_ratio: bool = False
    """REINFORCE/RLOO policy gradient -A * logprob (no ratio, no clip)."""
    force_on_policy_ratio: bool = False
    use_kl_in_reward: bool = False
    """Subtract reference_policy_kl_penalty x sequence KL from each reward instead of adding KL to the loss."""

    @model_validator(mode="after")
    def _valid_combination(self) -> LossConfig:
        if self.use_kl_in_reward and not self.reference_policy_kl_penalty > 0:
            raise ValueError("use_kl_in_reward needs reference_policy_kl_penalty > 0 (the KL coefficient)")
        self.trainer_loss()  # raises ValueError naming the conflicting keys
        return self

    def trainer_loss(self) -> GrpoLossConfig:
        """The trainer's loss for these keys (no KL term in it when the KL goes into the reward)."""
        fields = self.model_dump(exclude={"use_kl_in_reward"})
        if self.use_kl_in_reward:
            fields["reference_policy_kl_penalty"] = 0.0
        return GrpoLossConfig(**fields)


class AdvEstimatorConfig(_Section):
    """grpo.adv_estimator: how rewards become advantages (coordinator/advantages.py)."""

    name: Literal["grpo", "reinforce_plus_plus", "raw_reward"] = "grpo"
    """grpo: group baseline (grpo.use_leave_one_out_baseline; RLOO without grpo.normalize_rewards) and
    optional std normalisation; reinforce_plus_plus: group-mean baseline (minus_baseline), then
    normalisation over the batch's tokens; raw_reward: the reward itself (plain REINFORCE)."""
    minus_baseline: bool = True
    """reinforce_plus_plus: subtract the group mean before the batch normalisation."""


class RewardShapingConfig(_Section):
    """grpo.reward_shaping: DAPO's overlong penalty, linear over the last overlong_buffer_length
    tokens of the budget: min(0, -(length - (max - buffer)) / buffer * penalty)."""

    enabled: bool = False
    overlong_buffer_length: int = Field(128, gt=0)
    overlong_buffer_penalty: float = Field(1.0, ge=0)
    max_response_length: int | None = Field(None, gt=0)
    """Completion budget in tokens; null: policy.generation.max_new_tokens."""


class GRPOConfig(_Section):
    num_prompts_per_step: int = Field(16, gt=0)
    num_generations_per_prompt: int = Field(8, gt=1)
    max_num_steps: int = Field(60, ge=0)
    """GRPO steps; 0 skips GRPO."""
    normalize_rewards: bool = True
    """Divide advantages by the group's reward std."""
    use_leave_one_out_baseline: bool = True
    adv_estimator: AdvEstimatorConfig = AdvEstimatorConfig()
    advantage_clip: float | None = Field(None, gt=0)
    """Clamp advantages to [-advantage_clip, advantage_clip]; null: no clamp."""
    use_dynamic_sampling: bool = False
    """DAPO: drop prompt groups whose rewards all agree and draw more prompts until the batch is full."""
    batch_multiplier: float = Field(1.0, ge=1)
    """Dynamic sampling draws batch_multiplier x num_prompts_per_step prompts per generation round."""
    dynamic_sampling_max_gen_batches: int = Field(10, ge=1)
    """Generation rounds allowed to fill one batch before the step fails."""
    overlong_filtering: bool = False
    """Truncated completions get no loss (they still count in their group's baseline)."""
    reward_shaping: RewardShapingConfig = RewardShapingConfig()
    max_token_mult_prob_error: float | None = Field(1.05, gt=1)
    """Drift guard (coordinator/drift.py): stop the run once the step's token_mult_prob_error (mean
    exp(|trainer - generator logprob|), 1.0 on-policy) stays above this for drift_grace_steps
    consecutive steps; the error names the generators that drifted. null: never stop."""
    drift_grace_steps: int = Field(2, ge=1)
    """Consecutive GRPO steps over max_token_mult_prob_error before the run stops."""
    val_period: int = Field(10, ge=0)
    """Validate every this many steps (0: only at the start and the end)."""
    val_at_start: bool = True
    max_val_samples: int = Field(500, gt=0)
    seed: int = 42


class SFTConfig(_Section):
    max_num_steps: int = Field(2000, ge=0)
    """Most SFT optimizer steps before GRPO (the warm start); 0 skips SFT."""
    global_batch_size: int = Field(16, gt=0)
    """Samples per SFT optimizer step."""
    micro_batch_size: int = Field(64, gt=0)
    lr: float | None = Field(1e-3, gt=0)
    """Learning rate of the SFT phase (None: policy.optimizer.kwargs.lr)."""
    val_period: int = Field(50, gt=0)
    """Optimizer steps per trainer call; the held-out accuracy is checked after each."""
    stop_at_accuracy: float | None = Field(0.45, gt=0, le=1)
    """Stop the warm start once held-out accuracy reaches this (None: run max_num_steps)."""
    seed: int = 7


class DataConfig(_Section):
    dataset_name: Literal["arithmetic", "arithmetic_preference", "jsonl"] = "arithmetic"
    """`arithmetic`: the embedded synthetic task; `arithmetic_preference`: its embedded toy preference
    pairs (dpo/rm); `jsonl`: train_path / val_path files (prompt/answer rows, or prompt/chosen/rejected)."""
    train_path: str | None = None
    val_path: str | None = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    chosen_key: str = "chosen"
    """Preference rows (dpo/rm): the preferred response."""
    rejected_key: str = "rejected"
    """Preference rows (dpo/rm): the dispreferred response."""
    task_key: str = "task"
    default_task: str = "arithmetic"
    num_train: int = Field(6000, gt=0)
    num_val: int = Field(500, gt=0)
    """Held-out problems of the embedded task (the rest of the 8,100 sums are for training)."""
    seed: int = 0

    @model_validator(mode="after")
    def _paths_for_jsonl(self) -> DataConfig:
        if self.dataset_name == "jsonl" and not self.train_path:
            raise ValueError("data.train_path is required when data.dataset_name is jsonl")
        return self


class RewardModelEnvConfig(_Section):
    """env.<task>.reward_model (scorer: reward_model): reward_svc's RewardModelSettings, with
    model_name None = the embedded tiny reward model (coordinator/embedded/reward_model.py)."""

    model_name: str | None = None
    batch_size: int = Field(16, ge=1)
    max_length: int = Field(512, ge=2)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    squash: Literal["none", "sigmoid"] = "none"
    """none: the raw scalar is the reward; sigmoid: sigmoid(scalar). correct = scalar > 0."""


class EnvConfig(_Section):
    """One task's reward service (env.<task>)."""

    scorer: ScorerName = "exact"
    """exact: first line equals the answer; math: math-verify; code: sandboxed test cases;
    reward_model: a sequence-classification model's scalar (env.<task>.reward_model)."""
    num_workers: int = Field(1, ge=1)
    item_timeout_s: float = Field(5.0, gt=0)
    sandbox: SandboxLimits = SandboxLimits()
    """Limits of the code sandbox (scorer: code)."""
    max_turns: int = Field(4, ge=1)
    """Multi-turn scorers (calculator): most model turns per episode; then it ends, truncated."""
    max_tool_calls: int = Field(2, ge=0)
    """scorer: calculator: tool calls allowed per episode; one more ends it with reward 0."""
    reward_model: RewardModelEnvConfig = RewardModelEnvConfig()
    """scorer: reward_model: the sequence-classification model that scores prompt + completion."""
    external: bool = False
    """Served by a reward service that someone else starts (the Python API's reward_fn, or one you
    run yourself with --coordinator): local launch starts none for this task and waits for one to register."""


class ClusterConfig(_Section):
    num_nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    trainer_ranks: int = Field(2, ge=1)
    """torchrun processes of the trainer (local mode)."""
    num_generators: int = Field(1, ge=1)
    """Generator services to launch (local mode), or to wait for before starting (external); more may join later."""
    host: str = "127.0.0.1"
    """Address services bind and advertise."""
    port: int = Field(0, ge=0, le=65535)
    """Port of the coordinator's membership server (0: any free port; launch: external wants a fixed one)."""
    launch: Literal["local", "external"] = "local"
    """local: start every service as a child process. external: start none (docker compose, several
    hosts): wait for a trainer, num_generators generators and every task's reward service to register."""
    startup_timeout_s: float = Field(300, gt=0)
    max_trainer_restarts: int = Field(2, ge=0)
    """Times a trainer that dies during GRPO is relaunched (local mode), the run resuming from its
    last checkpoint; one more death stops the run."""


class CheckpointingConfig(_Section):
    enabled: bool = True
    checkpoint_dir: str | None = None
    """Default: <run dir>/checkpoints."""
    save_period: int = Field(20, gt=0)
    keep_top_k: int = Field(2, ge=1)


class LoggerConfig(_Section):
    log_dir: str = "runs"
    """Each run writes into <log_dir>/<run name>/."""
    run_name: str | None = None
    tensorboard_enabled: bool = True
    plot_enabled: bool = True


class ExperimentConfig(_Section):
    policy: PolicyConfig = PolicyConfig()
    loss_fn: LossConfig = LossConfig()
    grpo: GRPOConfig = GRPOConfig()
    sft: SFTConfig = SFTConfig()
    data: DataConfig = DataConfig()
    env: dict[str, EnvConfig] = Field(default_factory=lambda: {"arithmetic": EnvConfig()})
    cluster: ClusterConfig = ClusterConfig()
    checkpointing: CheckpointingConfig = CheckpointingConfig()
    logger: LoggerConfig = LoggerConfig()
    dpo: DPOConfig | None = None
    """DPO on preference pairs (coordinator/config_preference.py); its presence makes the run DPO."""
    rm: RMConfig | None = None
    """Reward-model training on preference pairs; its presence makes the run RM."""
    algorithm: Algorithm | None = Field(None, exclude=True)
    """Resolved from the dpo / rm sections at load; not a key to set."""

    @model_validator(mode="after")
    def _resolve_algorithm(self) -> ExperimentConfig:
        if self.algorithm is not None:
            raise ValueError("algorithm is derived from the dpo / rm sections; remove it")
        object.__setattr__(self, "algorithm", resolve_algorithm(self.dpo, self.rm, self.policy.reward_model_cfg,
                                                                self.data.dataset_name))
        if not self.algorithm.uses_rollouts and self.policy.train_global_batch_size % self.cluster.trainer_ranks:
            raise ValueError(f"policy.train_global_batch_size ({self.policy.train_global_batch_size} pairs) must be a "
                             f"multiple of cluster.trainer_ranks ({self.cluster.trainer_ranks})")
        if not self.algorithm.uses_rollouts and self.policy.backend is TrainingBackend.MEGATRON:
            raise ValueError(f"{self.algorithm.value} runs train on the DTensor backend only for now; set "
                             "policy.megatron_cfg.enabled=false (and policy.dtensor_cfg.enabled=true)")
        if not self.algorithm.uses_rollouts and self.policy.sequence_packing.enabled:
            raise ValueError(f"policy.sequence_packing.enabled is not supported for {self.algorithm.value} runs "
                             "(packing regroups samples and would split (chosen, rejected) pairs); set it to false")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        samples = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        if self.algorithm.uses_rollouts and self.grpo.max_num_steps and samples % self.policy.train_global_batch_size:
            raise ValueError(f"policy.train_global_batch_size ({self.policy.train_global_batch_size}) must divide "
                             f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({samples})")
        if self.policy.generation.backend == "megatron" and self.cluster.num_generators != 1:
            warnings.warn("cluster.num_generators is ignored with policy.generation.backend=megatron: the trainer "
                          "is the one generator", stacklevel=2)
        if self.data.default_task not in self.env:
            raise ValueError(f"data.default_task {self.data.default_task!r} has no env.{self.data.default_task} section")
        return self

    @model_validator(mode="after")
    def _parallel_layout(self) -> ExperimentConfig:
        dtensor, ranks = self.policy.dtensor_cfg, self.cluster.trainer_ranks
        if ranks % dtensor.tensor_parallel_size:
            raise ValueError(f"policy.dtensor_cfg.tensor_parallel_size ({dtensor.tensor_parallel_size}) must divide "
                             f"cluster.trainer_ranks ({ranks})")
        if dtensor.sequence_parallel and dtensor.tensor_parallel_size == 1:
            raise ValueError("policy.dtensor_cfg.sequence_parallel needs tensor_parallel_size > 1; set it to false")
        return self

    @model_validator(mode="after")
    def _colocated_memory(self) -> ExperimentConfig:
        generation = self.policy.generation
        share = generation.vllm_cfg.gpu_memory_utilization
        if generation.colocated.enabled and share is not None and share * self.cluster.num_generators >= 1:
            raise ValueError(f"policy.generation.vllm_cfg.gpu_memory_utilization ({share}) x cluster.num_generators "
                             f"({self.cluster.num_generators}) leaves nothing of the GPU that colocated generators "
                             "share with the trainer's rank 0; lower it (unset: 0.5 split between the generators) or "
                             "set policy.generation.colocated.enabled=false")
        return self

    @model_validator(mode="after")
    def _dapo_consistent(self) -> ExperimentConfig:
        shaping = self.grpo.reward_shaping
        budget = shaping.max_response_length or self.policy.generation.max_new_tokens
        if shaping.enabled and shaping.overlong_buffer_length > budget:
            raise ValueError(f"grpo.reward_shaping.overlong_buffer_length ({shaping.overlong_buffer_length}) must not "
                             f"exceed the completion budget ({budget}, grpo.reward_shaping.max_response_length or "
                             "policy.generation.max_new_tokens)")
        return self


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], YAML-parsed value)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    return key.split("."), yaml.safe_load(value) if value else None


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                raw: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load YAML (or a dict), apply dotted overrides, validate. Raises ConfigError."""
    data: dict[str, Any] = dict(raw or {})
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections")
        data.update(loaded)
    data = apply_overrides(data, overrides or [])
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    from coordinator.model_checks import ModelCheckError, check_model  # late: it reads this module's types

    try:
        check_model(cfg)  # the checkpoint against the config, before anything starts
    except ModelCheckError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key {key}: remove it or fix its spelling")
        else:
            lines.append(f"{key}: {message}" if key else message)
    return "invalid config: " + "; ".join(lines)
