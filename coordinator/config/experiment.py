"""The experiment configuration: one YAML file in NeMo-RL's schema. `ExperimentConfig` holds the
sections (policy.py, algorithms.py, preference.py, data.py, env.py, run.py) and the rules that
span several of them; loading.py parses files and overrides into it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from pydantic import Field, PrivateAttr, model_validator

from coordinator.config.algorithms import GRPOConfig, LossConfig, SFTConfig
from coordinator.config.data import DataConfig
from coordinator.config.defaults import check_length_keys, derived_defaults
from coordinator.config.distillation import DistillationConfig
from coordinator.config.env import EnvConfig
from coordinator.config.placement import Placement, place
from coordinator.config.policy import PolicyConfig
from coordinator.config.ppo import PPOConfig
from coordinator.config.preference import Algorithm, DPOConfig, RMConfig, resolve_algorithm
from coordinator.config.run import CheckpointingConfig, ClusterConfig, LoggerConfig
from coordinator.config.section import Section
from trainer_svc.config import LoraWeightSync, TrainingBackend


@dataclass(frozen=True)
class ServicePlan:
    """The services a run is made of beside its trainer, decided once by its algorithm (rollouts
    or not) and its generation backend: what is launched, waited for and kept alive follows from
    it, with nothing downstream re-deciding it."""

    generator_services: int
    """Generator services launched (local) or waited for (external): none for a run without
    rollouts (dpo, rm), or when the trainer generates (policy.generation.backend megatron)."""
    generators: int
    """Generators that must be live: the generator services, or the trainer's own one."""
    reward_tasks: tuple[str, ...]
    """The env.<task>s whose reward services must be live (none without rollouts), in config order: an
    agent task's is its environment service, which runs the agent (reward_svc/agents.py)."""
    teacher_services: int = 0
    """Distillation teacher services (generator services serving distillation.teacher) launched
    (local) or waited for (external); none unless the run distills."""
    critic_ranks: int = 0
    """torchrun ranks of the PPO critic's trainer service (ppo.critic.num_ranks), launched (local) or
    waited for (external); 0: no critic (the run is not PPO)."""


class ExperimentConfig(Section):
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
    """DPO on preference pairs (coordinator/config/preference.py); its presence makes the run DPO."""
    rm: RMConfig | None = None
    """Reward-model training on preference pairs; its presence makes the run RM."""
    distillation: DistillationConfig | None = None
    """On-policy distillation from a teacher (coordinator/config/distillation.py); its presence makes
    the run a distillation run (the rollout loop of grpo.*, trained with distillation.*'s loss)."""
    ppo: PPOConfig | None = None
    """PPO with a critic (coordinator/config/ppo.py); its presence makes the run a PPO run (the rollout
    loop of grpo.*, GAE advantages from a critic service's values)."""
    algorithm: Algorithm | None = Field(None, exclude=True)
    """Resolved from the dpo / rm sections at load; not a key to set."""
    _derived: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def service_plan(self) -> ServicePlan:
        """The services beside the trainer (ServicePlan)."""
        if not self.algorithm.uses_rollouts:
            return ServicePlan(0, 0, ())
        launched = self.cluster.num_generators if self.policy.generation.backend.separate_services else 0
        teachers = self.distillation.teacher.num_generators if self.distillation is not None else 0
        critic = self.ppo.critic.num_ranks if self.ppo is not None and self.ppo.critic is not None else 0
        return ServicePlan(launched, launched or 1, tuple(self.env), teachers, critic)

    @property
    def placement(self) -> Placement:
        """The GPUs each service on this node takes (config/placement.py); nothing on CPU nodes,
        nor on several nodes, where `tandem slurm` (or Kubernetes) gives each its GPUs."""
        cluster = self.cluster
        return place(cluster.gpus_per_node if cluster.num_nodes == 1 else 0, cluster.trainer_ranks,
                     self.service_plan.generator_services, self.policy.generation.vllm_cfg.num_workers,
                     self.policy.generation.colocated.enabled)

    @property
    def generators_share_trainer_device(self) -> bool:
        """Generators launched here on the trainer's GPU: colocated, or dedicated on a one-GPU node
        (weights then travel by CUDA IPC, tandem.colocation). Others place them elsewhere (external)."""
        generation = self.policy.generation
        return generation.colocated.enabled or (self.cluster.launch.starts_services
                                                and self.placement.generators_share_trainer_device)

    @property
    def generators_free_weights(self) -> bool:
        """CPU generators free their weights from the rollouts to the next publish
        (policy.generation.free_weights_while_training, resolved)."""
        configured = self.policy.generation.free_weights_while_training
        if configured is not None:
            return configured
        return (not self.grpo.async_grpo.enabled and not self.cluster.gpus_per_node
                and not self.generators_serve_adapters)

    @property
    def generators_serve_adapters(self) -> bool:
        """Weight versions are LoRA adapters served over the generators' base weights
        (policy.dtensor_cfg.lora_cfg.weight_sync: adapter)."""
        lora = self.policy.dtensor_cfg.lora_cfg
        return lora.enabled and lora.weight_sync is LoraWeightSync.ADAPTER

    @property
    def derived(self) -> dict[str, str]:
        """Dotted key -> why it has its value, for the keys filled in at load (config/defaults.py)."""
        return dict(self._derived)

    @model_validator(mode="after")
    def _resolve_trainer_ranks(self) -> ExperimentConfig:
        if self.cluster.trainer_ranks is None:
            cluster, policy = self.cluster, self.policy
            if cluster.gpus_per_node:
                ranks = cluster.gpus_per_node * cluster.num_nodes
            elif policy.backend is TrainingBackend.MEGATRON:
                ranks = (policy.megatron_cfg.tensor_model_parallel_size
                         * policy.megatron_cfg.pipeline_model_parallel_size)
            else:
                ranks = policy.dtensor_cfg.tensor_parallel_size
            object.__setattr__(cluster, "trainer_ranks", ranks)
        return self

    @model_validator(mode="after")
    def _resolve_algorithm(self) -> ExperimentConfig:
        if self.algorithm is not None:
            raise ValueError("algorithm is derived from the dpo / rm sections; remove it")
        object.__setattr__(self, "algorithm", resolve_algorithm(self.dpo, self.rm, self.policy.reward_model_cfg,
                                                                self.data.dataset_name,
                                                                distillation=self.distillation is not None,
                                                                ppo=self.ppo is not None))
        if not self.algorithm.uses_rollouts and self.policy.train_global_batch_size % self.cluster.trainer_ranks:
            raise ValueError(f"policy.train_global_batch_size ({self.policy.train_global_batch_size} pairs) must be a "
                             f"multiple of cluster.trainer_ranks ({self.cluster.trainer_ranks})")
        data = self.data
        if not self.algorithm.uses_rollouts and (data.prompt_format == "chat" or data.system_prompt_file
                                                 or data.prompt_file):
            raise ValueError(f"{self.algorithm.value} runs take their prompts as they are for now: remove "
                             "data.prompt_format chat, data.prompt_file and data.system_prompt_file")
        if not self.algorithm.uses_rollouts and self.policy.backend is TrainingBackend.MEGATRON:
            raise ValueError(f"{self.algorithm.value} runs train on the DTensor backend only for now; set "
                             "policy.megatron_cfg.enabled=false (and policy.dtensor_cfg.enabled=true)")
        if not self.algorithm.uses_rollouts and self.policy.sequence_packing.enabled:
            raise ValueError(f"policy.sequence_packing.enabled is not supported for {self.algorithm.value} runs "
                             "(packing regroups samples and would split (chosen, rejected) pairs); set it to false")
        return self

    @model_validator(mode="after")
    def _router_replay_on_gpus_needs_prefix_caching(self) -> ExperimentConfig:
        async_grpo = self.grpo.async_grpo
        if (self.policy.router_replay.enabled and self.cluster.gpus_per_node and async_grpo.in_flight_weight_updates
                and not async_grpo.recompute_kv_cache_after_weight_updates):
            raise ValueError("policy.router_replay on GPUs takes the routes from vLLM, which needs its prefix cache; "
                             "grpo.async_grpo.in_flight_weight_updates without recompute_kv_cache_after_weight_updates "
                             "turns it off: set grpo.async_grpo.recompute_kv_cache_after_weight_updates=true")
        return self

    @model_validator(mode="after")
    def _model_defaults(self) -> ExperimentConfig:
        """Fill the keys whose default depends on the model or on other keys (config/defaults.py)."""
        replaced, self._derived = derived_defaults(self)
        for name, section in replaced.items():
            object.__setattr__(self, name, section)
        check_length_keys(self)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        samples = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        if self.algorithm.uses_rollouts and self.grpo.max_num_steps and samples % self.policy.train_global_batch_size:
            raise ValueError(f"policy.train_global_batch_size ({self.policy.train_global_batch_size}) must divide "
                             f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({samples})")
        if not self.policy.generation.backend.separate_services and self.cluster.num_generators != 1:
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
        return self

    @model_validator(mode="after")
    def _placement_fits(self) -> ExperimentConfig:
        if self.cluster.launch.starts_services:
            _ = self.placement  # raises PlacementError (a ValueError) naming the keys
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
    def _async_consistent(self) -> ExperimentConfig:
        if not self.grpo.async_grpo.enabled:
            return self
        if not self.loss_fn.use_importance_sampling_correction:
            raise ValueError("grpo.async_grpo.enabled trains on trajectories sampled by older weights: set "
                             "loss_fn.use_importance_sampling_correction: true (it corrects for the difference)")
        if self.policy.generation.colocated.enabled:
            raise ValueError("grpo.async_grpo.enabled overlaps generation with training, which colocated generators "
                             "cannot do (they sleep while the trainer trains): set "
                             "policy.generation.colocated.enabled: false")
        if not self.policy.generation.backend.separate_services:
            raise ValueError("grpo.async_grpo.enabled needs generator services (the trainer cannot generate while it "
                             "trains): set policy.generation.backend: vllm")
        if self.policy.generation.free_weights_while_training:
            raise ValueError("grpo.async_grpo.enabled generates while the trainer trains, so the generators must keep "
                             "their weights: set policy.generation.free_weights_while_training: false (or leave it unset)")
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

    @model_validator(mode="after")
    def _ppo_consistent(self) -> ExperimentConfig:
        ppo = self.ppo
        if ppo is None:
            return self
        if self.grpo.async_grpo.enabled:
            raise ValueError("ppo runs synchronously for now (the critic values each step's samples with the weights "
                             "of that step): set grpo.async_grpo.enabled: false")
        if self.grpo.use_dynamic_sampling:
            raise ValueError("grpo.use_dynamic_sampling drops prompt groups whose rewards agree, which PPO's per-token "
                             "advantages do not need: set it to false with a ppo section")
        if self.cluster.gpus_per_node and self.cluster.launch.starts_services:
            raise ValueError("the PPO critic is launched on CPU nodes only for now: on GPUs start it yourself "
                             "(torchrun -m trainer_svc with value_model_cfg.enabled in its settings) and set "
                             "cluster.launch: external")
        critic, samples = ppo.critic, self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        batch = critic.train_global_batch_size or self.policy.train_global_batch_size
        if self.grpo.max_num_steps and samples % batch:
            raise ValueError(f"ppo.critic.train_global_batch_size ({batch}) must divide grpo.num_prompts_per_step x "
                             f"grpo.num_generations_per_prompt ({samples})")
        if batch % critic.num_ranks:
            raise ValueError(f"ppo.critic.train_global_batch_size ({batch}) must be a multiple of "
                             f"ppo.critic.num_ranks ({critic.num_ranks})")
        return self

    @model_validator(mode="after")
    def _adapter_sync_consistent(self) -> ExperimentConfig:
        if not self.generators_serve_adapters:
            return self
        generation = self.policy.generation
        if not generation.backend.separate_services or generation.colocated.enabled:
            raise ValueError("policy.dtensor_cfg.lora_cfg.weight_sync: adapter sends the adapters to dedicated vLLM "
                             "generators, which keep their base weights; colocated ones give their weights up while "
                             "the trainer trains: set lora_cfg.weight_sync: merged, or "
                             "policy.generation.colocated.enabled: false")
        if self.grpo.async_grpo.in_flight_weight_updates:
            raise ValueError("policy.dtensor_cfg.lora_cfg.weight_sync: adapter swaps vLLM's LoRA slot between calls, "
                             "not under requests in flight: set grpo.async_grpo.in_flight_weight_updates: false "
                             "(or lora_cfg.weight_sync: merged)")
        if generation.free_weights_while_training:
            raise ValueError("policy.dtensor_cfg.lora_cfg.weight_sync: adapter keeps the generators' base weights for "
                             "the whole run: set policy.generation.free_weights_while_training: false (or leave it "
                             "unset)")
        return self

    @model_validator(mode="after")
    def _distillation_consistent(self) -> ExperimentConfig:
        distillation = self.distillation
        if distillation is None:
            return self
        if self.loss_fn.use_kl_in_reward or self.loss_fn.reference_policy_kl_penalty > 0:
            raise ValueError("a distillation run trains with distillation.*'s loss, which has no KL to a reference "
                             "policy: remove loss_fn.use_kl_in_reward and loss_fn.reference_policy_kl_penalty (the "
                             "KL to the teacher is distillation.kl_penalty_coef)")
        if self.cluster.gpus_per_node and self.cluster.launch.starts_services:
            raise ValueError("distillation teachers are launched on CPU nodes only for now: on GPUs start them "
                             "yourself (python -m generator_svc with teacher: true in its settings) and set "
                             "cluster.launch: external")
        teacher_len = distillation.teacher_vllm(self.policy.generation.vllm_cfg).max_model_len
        new = self.policy.generation.max_new_tokens
        if teacher_len < new + 2:  # a prompt of at least one token, the completion and vLLM's one more
            raise ValueError(f"distillation.teacher.vllm_cfg.max_model_len ({teacher_len}) cannot hold a prompt, "
                             f"policy.generation.max_new_tokens ({new}) and one more token: raise it")
        return self
