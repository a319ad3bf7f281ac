"""`cluster.*`, `checkpointing.*`, `logger.*`: where the run's services run, and what it keeps
(metrics to JSONL and TensorBoard, optionally Weights & Biases and MLflow; NeMo-RL's key names)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator

from coordinator.config.section import Section


class Launch(StrEnum):
    """Who starts the run's services (`cluster.launch`), chosen once at load: callers ask it what
    that means for them instead of comparing its name."""

    LOCAL = "local"
    """Tandem starts every service as its own child process."""
    EXTERNAL = "external"
    """Someone else starts them (docker compose, several hosts) with `--coordinator`."""

    @property
    def starts_services(self) -> bool:
        """Whether the run launches its services itself (and so relaunches the ones that die, and
        may move the coordinator to another port: what it launches is told the new address)."""
        return self is Launch.LOCAL

    @property
    def dismisses_services(self) -> bool:
        """Whether the run tells its services at the end that it is over: the ones someone else
        started outlive the run's own processes and leave only when told."""
        return not self.starts_services

    @property
    def startup(self) -> str:
        """What the run does while its services come up, in words."""
        return "starting" if self.starts_services else "waiting for"


class ClusterConfig(Section):
    num_nodes: int = Field(1, ge=1)
    """Nodes of the cluster (NeMo-RL's key; local runs use this host)."""
    gpus_per_node: int = Field(0, ge=0)
    """GPUs per node (NeMo-RL's key; 0 on CPU machines). On one node (local launch) the trainer's
    ranks take the first GPUs and each dedicated generator the next tensor x pipeline parallel ones
    (on a one-GPU node it shares GPU 0 with the trainer, weights by CUDA IPC); each service sees
    only its own (CUDA_VISIBLE_DEVICES). A layout that does not fit fails at load."""
    trainer_ranks: int | None = Field(None, ge=1)
    """torchrun processes of the trainer (local mode). Unset: one per GPU (gpus_per_node x num_nodes),
    or on a CPU-only machine the fewest the parallel layout needs (its tensor x pipeline parallel
    sizes): more ranks on one CPU add gloo collectives and split the same cores (measured on 2 cores:
    0.57 s per step with 2 ranks, 0.37 s with 1)."""
    threads_per_service: int | None = Field(None, ge=1)
    """Intra-op threads (OMP_NUM_THREADS) of each trainer rank and each generator (local mode).
    Unset: this machine's cores divided among the trainer's ranks, and among the generators, since
    rollouts and training take turns in the synchronous step (split between both with async GRPO);
    reward services use 1."""
    num_generators: int = Field(1, ge=1)
    """Generator services to launch (local mode), or to wait for before starting (external); more may join later."""
    host: str = "127.0.0.1"
    """Address services bind and advertise."""
    port: int = Field(0, ge=0, le=65535)
    """Port of the coordinator's membership server (0: any free port; launch: external wants a fixed one)."""
    launch: Launch = Launch.LOCAL
    """local: start every service as a child process. external: start none (docker compose, several
    hosts): wait for a trainer, num_generators generators and every task's reward service to register."""
    startup_timeout_s: float = Field(300, gt=0)
    """How long the run waits for its services to register."""
    max_trainer_restarts: int = Field(2, ge=0)
    """Times a trainer that dies during GRPO (any of its ranks) is relaunched (local mode), the run
    resuming from its last checkpoint; one more death stops the run."""
    max_service_restarts: int = Field(3, ge=0)
    """Times each generator or reward service the run launched is relaunched after it dies (local
    mode), the first after restart_backoff_s, each later one after twice the wait before."""
    restart_backoff_s: float = Field(1.0, ge=0)
    """Wait before the first relaunch of a dead generator or reward service."""
    stopped_kill_s: float = Field(30.0, gt=0)
    """A service the run launched (local mode) with a process stopped (SIGSTOP, a debugger: state T)
    this long is killed, so that it is replaced as a dead one (a generator or reward service
    relaunched, the trainer relaunched from the last checkpoint). A stop shorter than this is a
    pause: the service goes on where it was."""


class CheckpointingConfig(Section):
    enabled: bool = True
    """Write loop checkpoints (trainer shards + coordinator state) during GRPO."""
    checkpoint_dir: str | None = None
    """Default: <run dir>/checkpoints."""
    save_period: int = Field(20, gt=0)
    """GRPO steps between checkpoints."""
    keep_top_k: int = Field(2, ge=1)
    """Checkpoints kept (the newest)."""
    max_failed_saves: int = Field(3, ge=0)
    """Checkpoints that may fail in a row (a full disk, a write error) while the run goes on:
    each is logged (checkpoint_failed in logs/coordinator.log), its partial directory removed,
    and the last complete checkpoint stays the one a restart resumes from; one more stops the
    run with the error (free the space, then run the same command again to resume). 0: the
    first failed checkpoint stops the run."""
    save_hf: bool = False
    """Also write each checkpoint's model as a Hugging Face checkpoint (<checkpoint>/hf). Every
    run ends with one in <run>/hf either way; `tandem export` makes one from any checkpoint."""
    direct_io: bool = True
    """The DTensor trainer writes its checkpoint files and reads them back on resume with O_DIRECT
    where the filesystem takes it, through no page cache (at the 0.5B shape on a VM whose host
    reclaims free memory: a write ~15x faster than buffered, the trainer's load measured alone
    ~2x; a whole resume in the service costs the same either way there, the load's gain paid back
    by the generator's first reload: benchmarks/results/2026-12-02-resume-reads.md). false: through
    the page cache, for a filesystem where direct I/O is slow (some network filesystems)."""


class WandbConfig(Section):
    """logger.wandb: the Weights & Biases run (wandb.init's arguments, as NeMo-RL passes them)."""

    project: str = "tandem"
    """The W&B project."""
    name: str | None = None
    """Default: the run's name."""
    entity: str | None = None
    """The W&B entity (team or user; None: the account's default)."""
    mode: Literal["online", "offline", "disabled"] | None = None
    """offline: write the run under <run dir>/wandb, nothing sent (`wandb sync` uploads it later);
    null: WANDB_MODE from the environment, else online."""


class TensorboardConfig(Section):
    """logger.tensorboard."""

    log_dir: str | None = None
    """Default: <run dir>/tensorboard."""


class MLflowConfig(Section):
    """logger.mlflow: the MLflow run."""

    experiment_name: str = "tandem"
    """The MLflow experiment (created when missing)."""
    run_name: str | None = None
    """Default: the run's name."""
    run_id: str | None = None
    """Continue this MLflow run instead of starting one."""
    tracking_uri: str | None = None
    """Default: MLFLOW_TRACKING_URI from the environment, else a local file store in <run dir>/mlruns."""
    artifact_location: str | None = None
    """Where a new experiment keeps its artifacts (default: the tracking store's choice)."""


class LoggerConfig(Section):
    log_dir: str = "runs"
    """Each run writes into <log_dir>/<run name>/."""
    run_name: str | None = None
    """Default: the start time and a random suffix. A plain name: the run's directory is <log_dir>/<run_name>."""
    tensorboard_enabled: bool = True
    """Write the metrics for TensorBoard too."""
    tensorboard: TensorboardConfig = TensorboardConfig()
    wandb_enabled: bool = False
    """Log the metrics, the config and sample generations to Weights & Biases (pip install wandb)."""
    wandb: WandbConfig = WandbConfig()
    mlflow_enabled: bool = False
    """Log the metrics, the config and sample generations to MLflow (pip install mlflow-skinny)."""
    mlflow: MLflowConfig = MLflowConfig()
    num_val_samples_to_print: int = Field(8, ge=0)
    """Generations kept from each validation (prompt, completion, answer, reward): <run dir>/samples.jsonl,
    a TensorBoard text, a W&B table, an MLflow table."""
    plot_enabled: bool = True
    """Draw curves.png at the end of the run."""

    @field_validator("run_name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        """A run's files stay inside log_dir: the name is one path component."""
        if value is not None and (not value.strip() or value in (".", "..") or any(c in value for c in "/\\\0")):
            raise ValueError(f"{value!r} is not a plain name (it must not be empty, '.', '..' or hold '/', '\\' "
                             "or NUL): the run's directory is <logger.log_dir>/<run_name>; set logger.log_dir to "
                             "choose where runs go")
        return value
