"""From the experiment config to the local service processes: each service gets only its
own section, written as a settings JSON file that its entry point validates."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from coordinator.config import ExperimentConfig, RewardModelEnvConfig
from coordinator.launcher import LocalLauncher, ServiceSpec, python_module, torchrun_module
from coordinator.registry import Member
from generator_svc.config import GeneratorSettings
from reward_svc.config import RewardModelSettings, RewardSettings
from trainer_svc.config import TrainerSettings


def trainer_settings(cfg: ExperimentConfig, model_dir: str) -> TrainerSettings:
    policy = cfg.policy
    opt = policy.optimizer.kwargs
    return TrainerSettings.model_validate({
        "model_name": model_dir, "seed": cfg.grpo.seed, "dtype": policy.precision,
        "optimizer": {"lr": opt.lr, "weight_decay": opt.weight_decay, "betas": list(opt.betas), "eps": opt.eps},
        "max_grad_norm": policy.max_grad_norm,
        "dtensor_cfg": policy.dtensor_cfg.model_dump(),
        "sequence_packing": policy.sequence_packing.model_dump(),
        "reward_model_cfg": policy.reward_model_cfg.model_dump(),
        "megatron_cfg": policy.megatron_cfg.model_dump(),
        "weight_sync_host": cfg.cluster.host,
        "generation": {"enabled": policy.generation.backend == "megatron",
                       "max_num_seqs": policy.generation.mcore_generation_config.max_num_seqs,
                       "max_model_len": policy.max_total_sequence_length},
    })


def generator_settings(cfg: ExperimentConfig, model_dir: str, index: int, scratch: Path) -> GeneratorSettings:
    vllm = cfg.policy.generation.vllm_cfg
    colocated = cfg.policy.generation.colocated.enabled
    return GeneratorSettings.model_validate({
        "model_name": model_dir, "dtype": cfg.policy.precision, "max_model_len": vllm.max_model_len,
        "max_num_seqs": vllm.max_num_seqs, "kv_cache_space_gib": vllm.kv_cache_space_gib,
        "seed": cfg.grpo.seed + index, "enforce_eager": vllm.enforce_eager, "scratch_dir": str(scratch),
        "colocated": colocated, "gpu_memory_utilization": gpu_memory_utilization(cfg),
    })


def gpu_memory_utilization(cfg: ExperimentConfig) -> float:
    """Each generator's share of its GPU: the configured one, else 0.9 for dedicated generators
    and 0.5 split between colocated ones (they share the trainer's rank-0 device)."""
    configured = cfg.policy.generation.vllm_cfg.gpu_memory_utilization
    if configured is not None:
        return configured
    return 0.5 / cfg.cluster.num_generators if cfg.policy.generation.colocated.enabled else 0.9


def reward_settings(cfg: ExperimentConfig, task: str) -> RewardSettings:
    env = cfg.env[task]
    return RewardSettings(tasks={task: env.scorer}, num_workers=env.num_workers, item_timeout_s=env.item_timeout_s,
                          sandbox=env.sandbox, max_tool_calls=env.max_tool_calls,
                          reward_model=reward_model_settings(env.reward_model) if env.scorer == "reward_model" else None)


def reward_model_settings(rm: RewardModelEnvConfig) -> RewardModelSettings:
    """env.<task>.reward_model -> the service's settings; model_name None builds (once) the embedded tiny one."""
    model_name = rm.model_name
    if model_name is None:
        from coordinator.embedded.reward_model import ensure_tiny_reward_model
        from coordinator.run import cache_root  # late: coordinator.run imports this module

        model_name = str(ensure_tiny_reward_model(cache_root()))
    return RewardModelSettings(model_name=model_name, **rm.model_dump(exclude={"model_name"}))


def scratch_root(run_dir: Path) -> Path:
    """A short per-run scratch directory for the generators: vLLM puts unix sockets there,
    whose paths are limited to ~107 bytes, so it cannot live under an arbitrary run dir."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"tandem-{os.getuid()}" / digest


def launch_all(cfg: ExperimentConfig, model_dir: str, run_dir: Path, coordinator: str,
               launcher: LocalLauncher) -> None:
    """Start the trainer (torchrun), then, if the algorithm has rollouts, the generators (none when
    the trainer generates itself: policy.generation.backend megatron) and one reward service per task."""
    settings_dir = run_dir / "services"
    settings_dir.mkdir(parents=True, exist_ok=True)
    common = ["--host", cfg.cluster.host, "--coordinator", coordinator]

    def write(name: str, settings) -> str:
        path = settings_dir / f"{name}.json"
        path.write_text(settings.model_dump_json(indent=1))
        return str(path)

    launcher.start(ServiceSpec("trainer", torchrun_module(
        "trainer_svc", cfg.cluster.trainer_ranks, "--settings", write("trainer", trainer_settings(cfg, model_dir)),
        *common)))
    if not cfg.algorithm.uses_rollouts:  # dpo, rm: the trainer alone
        return
    for index in range(_num_generator_services(cfg)):
        name = f"generator-{index}"
        settings = generator_settings(cfg, model_dir, index, scratch_root(run_dir) / name)
        launcher.start(ServiceSpec(name, python_module("generator_svc", "--settings", write(name, settings), *common),
                                   essential=False))  # a dead one's requests go to the others (rollout.py)
    for task in (t for t, env in cfg.env.items() if not env.external):  # external: someone else serves it
        name = f"reward-{task}"
        launcher.start(ServiceSpec(name, python_module("reward_svc", "--settings",
                                                       write(name, reward_settings(cfg, task)), *common),
                                   essential=False))  # swappable: its calls are retried (coordinator/scoring.py)


def _num_generator_services(cfg: ExperimentConfig) -> int:
    """Generator services to launch or wait for: none when the trainer is the generator."""
    return 0 if cfg.policy.generation.backend == "megatron" else cfg.cluster.num_generators


def all_registered(cfg: ExperimentConfig):
    """Predicate over live members: the trainer, every generator (the trainer's own, with
    policy.generation.backend megatron) and every task's reward service."""
    generators = max(_num_generator_services(cfg), 1)

    def ready(members: list[Member]) -> bool:
        kinds = [m.kind for m in members]
        tasks = {t for m in members if m.kind == "reward" for t in m.tasks}
        if not cfg.algorithm.uses_rollouts:
            return "trainer" in kinds
        return ("trainer" in kinds and kinds.count("generator") >= generators
                and set(cfg.env) <= tasks)
    return ready
