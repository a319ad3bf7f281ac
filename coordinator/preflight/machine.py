"""Checks of a valid config against this machine, made before anything starts: the directories
the run will write (logger.log_dir and the run's directory in it, checkpointing.checkpoint_dir)
can be created and written, and the memory the generators would reserve exists. A directory is
judged by trying (and whatever the try made is removed again). Each failure is a ConfigError
naming the key and what to change.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from coordinator.config.experiment import ExperimentConfig
from coordinator.config.loading import ConfigError

GIB = 1 << 30


def check_machine(cfg: ExperimentConfig, meminfo: Path = Path("/proc/meminfo")) -> None:
    """Every check of this module; raises the first ConfigError."""
    check_writable_dir(Path(cfg.logger.log_dir), "logger.log_dir")
    if cfg.logger.run_name:
        run_dir = Path(cfg.logger.log_dir) / cfg.logger.run_name
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"logger.run_name: {run_dir} exists and is not a directory; choose another run name")
    if cfg.checkpointing.enabled and cfg.checkpointing.checkpoint_dir:
        check_writable_dir(Path(cfg.checkpointing.checkpoint_dir), "checkpointing.checkpoint_dir")
    check_kv_cache_memory(cfg, meminfo)
    check_gpus_declared(cfg, _visible_gpus())


def _visible_gpus(driver: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """The GPUs the NVIDIA driver shows (one directory each), as CUDA_VISIBLE_DEVICES narrows them.
    Not torch.cuda.device_count(): importing torch costs the coordinator ~1 CPU-s before it
    launches the services (tests/unit/coordinator/launch/test_launch_imports.py)."""
    found = len(list(driver.iterdir())) if driver.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]))


def check_gpus_declared(cfg: ExperimentConfig, gpus: int) -> None:
    """A local run on a machine with GPUs must say so (cluster.gpus_per_node): left at 0 nothing is
    placed (config/placement.py), the trainer and every generator see all GPUs and all take the
    first one (vLLM then refuses to start beside the trainer, or NCCL finds a duplicate GPU)."""
    if cfg.cluster.launch.starts_services and gpus and not cfg.cluster.gpus_per_node:
        raise ConfigError(f"cluster.gpus_per_node is 0 but this machine has {gpus} GPU(s): set cluster.gpus_per_node="
                          f"{gpus} so that each service gets GPUs of its own (or hide them: CUDA_VISIBLE_DEVICES=)")


def check_writable_dir(path: Path, key: str) -> None:
    """`path` is a directory this process can write, or can be created as one. Judged by trying:
    the missing directories are made, a file is written and removed, and what was made is removed
    again (permission bits alone say nothing for root, or on a read-only or virtual filesystem)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {path} is a file, not a directory; point {key} at a directory")
    made = [p for p in [path.absolute(), *path.absolute().parents] if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tandem-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{key}: cannot create or write {path} ({reason}"
                          f"{f': {exc.filename}' if exc.filename and str(exc.filename) != str(path) else ''}); "
                          "choose a directory this user can write") from None
    finally:
        for directory in made:  # deepest first
            try:
                directory.rmdir()
            except OSError:
                pass


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable of this machine (None where it cannot be read)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_kv_cache_memory(cfg: ExperimentConfig, meminfo: Path = Path("/proc/meminfo")) -> None:
    """CPU generators launched here reserve vllm_cfg.kv_cache_space_gib each at start (when it is
    set; unset, the KV cache is sized from the workload and counted by the run's memory estimate,
    coordinator/preflight/memory.py): all of them together must fit in the memory available."""
    generation = cfg.policy.generation
    if (not cfg.cluster.launch.starts_services or cfg.cluster.gpus_per_node or not cfg.service_plan.generator_services
            or generation.vllm_cfg.kv_cache_space_gib is None):
        return
    available = available_memory_bytes(meminfo)
    wanted = generation.vllm_cfg.kv_cache_space_gib * cfg.cluster.num_generators * GIB
    if available is not None and wanted > available:
        raise ConfigError(f"policy.generation.vllm_cfg.kv_cache_space_gib: {generation.vllm_cfg.kv_cache_space_gib} "
                          f"GiB x {cfg.cluster.num_generators} generator(s) is more than this machine's available "
                          f"memory ({available / GIB:.1f} GiB); lower it (a tiny model needs 1)")
