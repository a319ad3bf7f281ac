"""From the experiment config to the local service processes: each service gets only its
own section, written as a settings JSON file that its entry point validates."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.config import ExperimentConfig
from coordinator.embedded.cache import cache_root
from coordinator.launch.launcher import LocalLauncher, ServiceSpec, python_module, torchrun_module
from coordinator.membership.registry import Member
from generator_svc.config import GeneratorSettings, LoraAdapterServing
from reward_svc.config import RewardModelSettings, RewardSettings, ScoringSettings
from tandem.kinds import ServiceKind
from trainer_svc.config import GenerationSettings, TrainerSettings, ValueModelSettings


def serving_dtype(cfg: ExperimentConfig) -> str:
    """The dtype the generators serve, given to them and to the trainer, which publishes in it
    (not in the checkpoint's dtype: the generators get exactly the weights it trains)."""
    return cfg.policy.precision


def trainer_settings(cfg: ExperimentConfig, model_dir: str) -> TrainerSettings:
    policy = cfg.policy
    return TrainerSettings(
        model_name=model_dir, seed=cfg.grpo.seed, dtype=policy.precision, optimizer=policy.optimizer.kwargs,
        max_grad_norm=policy.max_grad_norm, dtensor_cfg=policy.dtensor_cfg, sequence_packing=policy.sequence_packing,
        reward_model_cfg=policy.reward_model_cfg, megatron_cfg=policy.megatron_cfg, weight_sync_host=cfg.cluster.host,
        weight_sync_dtype=serving_dtype(cfg), router_replay=policy.router_replay,
        checkpoint_direct_io=cfg.checkpointing.direct_io,
        generation=GenerationSettings(enabled=not policy.generation.backend.separate_services,
                                      max_num_seqs=policy.generation.mcore_generation_config.max_num_seqs,
                                      max_model_len=policy.max_total_sequence_length))


def critic_settings(cfg: ExperimentConfig, model_dir: str) -> TrainerSettings:
    """The PPO critic's trainer settings (ppo.critic, coordinator/config/ppo.py): a value model
    (value_model_cfg.enabled) on its own checkpoint, optimizer and DTensor settings; `model_dir` is
    the policy's checkpoint, the critic's unless ppo.critic.model_name is set."""
    assert cfg.ppo is not None and cfg.ppo.critic is not None
    critic = cfg.ppo.critic
    return TrainerSettings(
        model_name=critic.model_name or model_dir, seed=cfg.grpo.seed + 2000, dtype=critic.precision or cfg.policy.precision,
        optimizer=critic.optimizer.kwargs, max_grad_norm=critic.max_grad_norm, dtensor_cfg=critic.dtensor_cfg,
        value_model_cfg=ValueModelSettings(enabled=True), weight_sync_host=cfg.cluster.host,
        checkpoint_direct_io=cfg.checkpointing.direct_io)


def generator_settings(cfg: ExperimentConfig, model_dir: str, index: int, scratch: Path) -> GeneratorSettings:
    generation = cfg.policy.generation
    return GeneratorSettings(**generation.vllm_cfg.model_dump(exclude={"gpu_memory_utilization", "enforce_eager"}),
                             enforce_eager=enforce_eager(cfg), model_name=model_dir, dtype=serving_dtype(cfg),
                             seed=cfg.grpo.seed + index,
                             scratch_dir=scratch, cache_dir=cache_root() / "vllm", colocated=generation.colocated.enabled,
                             gpu_memory_utilization=gpu_memory_utilization(cfg),
                             in_flight_weight_updates=cfg.grpo.async_grpo.in_flight_weight_updates,
                             recompute_kv_cache_after_weight_updates=(
                                 cfg.grpo.async_grpo.recompute_kv_cache_after_weight_updates),
                             free_weights_while_training=cfg.generators_free_weights,
                             return_routed_experts=cfg.policy.router_replay.enabled,
                             lora_adapters=lora_adapter_serving(cfg))


def lora_adapter_serving(cfg: ExperimentConfig) -> LoraAdapterServing | None:
    """The adapters' rank and alpha where generators serve LoRA adapters (lora_cfg.weight_sync: adapter)."""
    if not cfg.generators_serve_adapters:
        return None
    lora = cfg.policy.dtensor_cfg.lora_cfg
    return LoraAdapterServing(rank=lora.dim, alpha=lora.alpha)


def teacher_settings(cfg: ExperimentConfig, index: int, scratch: Path) -> GeneratorSettings:
    """A distillation teacher's generator settings: distillation.teacher's model, dtype and vLLM
    settings (coordinator/config/distillation.py), announced as a teacher (never sent weights)."""
    distillation = cfg.distillation
    assert distillation is not None and distillation.teacher.model_name is not None
    teacher = distillation.teacher
    vllm = distillation.teacher_vllm(cfg.policy.generation.vllm_cfg)
    return GeneratorSettings(**vllm.model_dump(exclude={"gpu_memory_utilization", "enforce_eager"}),
                             enforce_eager=True if vllm.enforce_eager is None else vllm.enforce_eager,
                             model_name=teacher.model_name, dtype=teacher.precision or cfg.policy.precision,
                             seed=cfg.grpo.seed + 1000 + index, scratch_dir=scratch, cache_dir=cache_root() / "vllm",
                             teacher=True)


def enforce_eager(cfg: ExperimentConfig) -> bool:
    """vllm_cfg.enforce_eager, else eager on CPU nodes only: on GPUs vLLM's torch.compile and CUDA
    graphs are its speed (cluster.gpus_per_node says which kind the generators run on)."""
    configured = cfg.policy.generation.vllm_cfg.enforce_eager
    return configured if configured is not None else not cfg.cluster.gpus_per_node


def gpu_memory_utilization(cfg: ExperimentConfig) -> float:
    """Each generator's share of its GPU: the configured one, else 0.9 for dedicated generators
    on GPUs of their own and 0.5 split between generators that share the trainer's device
    (colocated, or dedicated on a one-GPU node: cfg.placement)."""
    configured = cfg.policy.generation.vllm_cfg.gpu_memory_utilization
    if configured is not None:
        return configured
    return 0.5 / cfg.cluster.num_generators if cfg.generators_share_trainer_device else 0.9


def reward_settings(cfg: ExperimentConfig, task: str) -> RewardSettings:
    """env.<task> as the reward service's settings: an agent task's service runs its agent (and
    scores nothing); a reward model left unset (scorer reward_model) is the embedded tiny one, built once."""
    env = cfg.env[task]
    scoring = env.model_dump(include=set(ScoringSettings.model_fields))
    if env.agent is not None:
        return RewardSettings(tasks={}, agents={task: env.agent}, **scoring)
    if env.scorer.needs_model and env.reward_model.model_name is None:
        from coordinator.embedded.reward_model import ensure_tiny_reward_model

        scoring["reward_model"] = RewardModelSettings(**{**scoring["reward_model"],
                                                         "model_name": str(ensure_tiny_reward_model(cache_root()))})
    return RewardSettings(tasks={task: env.scorer}, **scoring)


def scratch_root(run_dir: Path) -> Path:
    """A short per-run scratch directory for the generators: vLLM puts unix sockets there,
    whose paths are limited to ~107 bytes, so it cannot live under an arbitrary run dir."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"tandem-{os.getuid()}" / digest


def trainer_starts_first(cfg: ExperimentConfig) -> bool:
    """Whether the generators start only once the trainer has registered: those on the trainer's
    GPU (colocated, or a one-GPU node). vLLM sizes its KV cache by profiling the device's free
    memory at start-up and refuses to go on if another process frees memory meanwhile
    (vllm/v1/worker/gpu_worker.py: "Error in memory profiling"); a registered trainer
    has built its model and holds its memory still until the run's first step, which waits for
    every generator."""
    return cfg.cluster.gpus_per_node > 0 and cfg.generators_share_trainer_device


def launch_all(cfg: ExperimentConfig, model_dir: str, run_dir: Path, coordinator: str,
               launcher: LocalLauncher, *, trainer_only: bool = False,
               trainer_ready: Callable[[], None] | None = None, tensor_env: Mapping[str, str] | None = None) -> None:
    """Start the trainer (torchrun), then, if the algorithm has rollouts, the generators (none when
    the trainer generates itself: policy.generation.backend megatron) and one reward service per task.
    `trainer_ready` waits until the trainer has registered: called before the generators start
    where they share its GPU (`trainer_starts_first`). `tensor_env`: added to the environment of
    the services that hold a model's tensors (trainer, critic, generators): the allocator
    (tandem/host_memory.py)."""
    settings_dir = run_dir / "services"
    settings_dir.mkdir(parents=True, exist_ok=True)
    common = ["--host", cfg.cluster.host, "--coordinator", coordinator]

    def write(name: str, settings) -> str:
        path = settings_dir / f"{name}.json"
        path.write_text(settings.model_dump_json(indent=1))
        return str(path)

    threads, placement = service_threads(cfg), cfg.placement  # each service sees only its own GPUs
    tensors = dict(tensor_env or {})
    launcher.start(ServiceSpec("trainer", torchrun_module(
        "trainer_svc", cfg.cluster.trainer_ranks, "--settings", write("trainer", trainer_settings(cfg, model_dir)),
        *common), env=threads.env(ServiceKind.TRAINER) | placement.trainer_env() | tensors))
    if trainer_only:
        return
    plan = cfg.service_plan  # dpo, rm: no generators and no reward services
    if plan.critic_ranks:  # PPO: the critic is a second trainer, essential like the first
        launcher.start(ServiceSpec("critic", torchrun_module(
            "trainer_svc", plan.critic_ranks, "--settings", write("critic", critic_settings(cfg, model_dir)), *common),
            env=threads.env(ServiceKind.CRITIC) | tensors))
    if plan.generator_services and trainer_ready is not None and trainer_starts_first(cfg):
        trainer_ready()
    for index in range(plan.generator_services):
        name = f"generator-{index}"
        settings = generator_settings(cfg, model_dir, index, scratch_root(run_dir) / name)
        launcher.start(ServiceSpec(name, python_module("generator_svc", "--settings", write(name, settings), *common),
                                   env=threads.env(ServiceKind.GENERATOR) | placement.generator_env(index) | tensors,
                                   essential=False))  # a dead one's requests go to the others (rollout.py)
    for index in range(plan.teacher_services):
        name = f"teacher-{index}"
        settings = teacher_settings(cfg, index, scratch_root(run_dir) / name)
        launcher.start(ServiceSpec(name, python_module("generator_svc", "--settings", write(name, settings), *common),
                                   env=threads.env(ServiceKind.TEACHER),
                                   essential=False))  # its sequences go to the other teachers (loop/teacher.py)
    for task in (t for t in plan.reward_tasks if not cfg.env[t].external):  # external: someone else serves it
        name = f"reward-{task}"
        launcher.start(ServiceSpec(name, python_module("reward_svc", "--settings",
                                                       write(name, reward_settings(cfg, task)), *common),
                                   env=threads.env(ServiceKind.REWARD),
                                   essential=False))  # swappable: its calls are retried (coordinator/loop/scoring.py)


@dataclass(frozen=True)
class ServiceThreads:
    """Intra-op threads of each local service process (OMP_NUM_THREADS)."""

    trainer_rank: int
    generator: int
    reward: int = 1

    def env(self, kind: ServiceKind) -> dict[str, str]:
        threads = {ServiceKind.TRAINER: self.trainer_rank, ServiceKind.CRITIC: self.trainer_rank,
                   ServiceKind.GENERATOR: self.generator, ServiceKind.TEACHER: self.generator,
                   ServiceKind.REWARD: self.reward}[kind]
        return {"OMP_NUM_THREADS": str(threads)}


def service_threads(cfg: ExperimentConfig, cores: int | None = None) -> ServiceThreads:
    """cluster.threads_per_service, else this machine's cores shared out: in the synchronous step
    rollouts and training take turns, so the trainer's ranks share all cores and so do the
    generators; with async GRPO they run at once and each side gets half."""
    if cfg.cluster.threads_per_service is not None:
        return ServiceThreads(cfg.cluster.threads_per_service, cfg.cluster.threads_per_service)
    cores = cores or len(os.sched_getaffinity(0))
    generators = max(cfg.service_plan.generator_services, 1)
    trainer_cores = cores // 2 if cfg.grpo.async_grpo.enabled and cores > 1 else cores
    generator_cores = cores - trainer_cores if cfg.grpo.async_grpo.enabled and cores > 1 else cores
    return ServiceThreads(max(1, trainer_cores // cfg.cluster.trainer_ranks), max(1, generator_cores // generators))


def all_registered(cfg: ExperimentConfig, trainer_only: bool = False):
    """Predicate over live members: the trainer (and a PPO run's critic), every generator (the
    trainer's own, with policy.generation.backend megatron), every distillation teacher and every
    task's reward service; trainer_only: the trainer."""
    plan = cfg.service_plan

    def ready(members: list[Member]) -> bool:
        kinds = [m.kind for m in members]
        tasks = {t for m in members if m.kind is ServiceKind.REWARD for t in m.tasks}
        if trainer_only:
            return ServiceKind.TRAINER in kinds
        critic = not plan.critic_ranks or ServiceKind.CRITIC in kinds
        return (critic and ServiceKind.TRAINER in kinds and kinds.count(ServiceKind.GENERATOR) >= plan.generators

                and kinds.count(ServiceKind.TEACHER) >= plan.teacher_services and set(plan.reward_tasks) <= tasks)
    return ready
