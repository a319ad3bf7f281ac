"""Tandem as Slurm work: where each service of a run goes (the plan) and the sbatch scripts
that put it there. Pure functions of the config and a few options; coordinator/cli/slurm.py
writes the files and calls sbatch.

One run is one batch job of `trainer nodes + generator nodes` nodes:

    batch host (node 0)     the coordinator (in the batch script), the reward services
    nodes 0..T-1            one `srun` step: torchrun on every node, c10d rendezvous on node 0
    nodes T..T+G-1          one `srun` step per generator (one GPU each on GPU nodes)

Every step runs `python -m coordinator.cli.container ROLE` (the entry point of compose and of
services on several hosts) with the same TANDEM_CONFIG / TANDEM_OVERRIDES; the token is the
run's 0600 file, named by TANDEM_TOKEN_FILE, never a command-line argument. More generators
join later as their own job (`join_script`): it reads the coordinator's address from the run
directory and registers like any generator. `scancel --batch --signal=TERM JOB` makes them drain
(the script sends SIGTERM to each generator's own process, which finishes what it holds);
a plain `scancel JOB` signals every process of the steps, vLLM's engine included, so their
requests in flight are re-sent to the other generators instead. A requeued job
(`--requeue`: preemption, node failure, `scontrol requeue`) runs the same script again: the
coordinator finds the run's last checkpoint and resumes (coordinator/checkpoint/resume.py).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.config import ExperimentConfig
from tandem.host_memory import HUGE_PAGES_VAR

ADDRESS_FILE = "coordinator"  # <run>/slurm/coordinator: HOST:PORT of the running coordinator


class SlurmPlanError(ValueError):
    """The config cannot be placed as Slurm work; the message says what to change."""


@dataclass(frozen=True)
class Layout:
    """What one run asks of Slurm, derived from the config."""

    trainer_nodes: int
    ranks_per_node: int
    trainer_gpus_per_node: int  # 0: CPU nodes
    num_generators: int
    generator_nodes: int
    generators_per_node: int
    gpus_per_generator: int  # 0 (CPU) or vllm_cfg tensor x pipeline parallel sizes
    tasks: tuple[str, ...]  # reward services to run, one per env.<task> not marked external

    @property
    def nodes(self) -> int:
        return self.trainer_nodes + self.generator_nodes

    @property
    def gpus(self) -> bool:
        return self.trainer_gpus_per_node > 0 or self.gpus_per_generator > 0


@dataclass(frozen=True)
class Options:
    """How to submit (the `tandem slurm` flags) and where the run lives."""

    run_name: str
    run_dir: Path
    python: str  # the interpreter every node runs (a shared virtual environment)
    workdir: Path  # the steps' working directory (--chdir)
    config: Path | None  # the experiment YAML, copied into the run directory
    overrides: tuple[str, ...] = ()
    port: int = 50051
    rdzv_port: int = 29400
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    cpus_per_generator: int = 1
    requeue: bool = True
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def logs(self) -> Path:
        return self.run_dir / "slurm" / "logs"

    @property
    def job_name(self) -> str:
        return f"tandem-{self.run_name}"


def plan(cfg: ExperimentConfig) -> Layout:
    """The layout of cfg's services on Slurm nodes, or SlurmPlanError naming the key to change."""
    cluster, generation = cfg.cluster, cfg.policy.generation
    if generation.colocated.enabled:
        raise SlurmPlanError("policy.generation.colocated.enabled: colocated generators share the trainer's devices "
                             "on one host; `tandem slurm` places dedicated generators: set it to false")
    if cfg.distillation is not None:
        raise SlurmPlanError("distillation: `tandem slurm` does not place teacher services yet; start them as "
                             "generator services with teacher: true in their settings (they register with the "
                             "coordinator) and run with cluster.launch: external")
    if cfg.ppo is not None:
        raise SlurmPlanError("ppo: `tandem slurm` does not place the critic service yet; start it as a trainer "
                             "service with value_model_cfg.enabled in its settings (it registers with the coordinator) "
                             "and run with cluster.launch: external")
    if cluster.gpus_per_node:
        if cluster.trainer_ranks != cluster.num_nodes * cluster.gpus_per_node:
            raise SlurmPlanError(f"cluster.trainer_ranks ({cluster.trainer_ranks}) must be cluster.num_nodes x "
                                 f"cluster.gpus_per_node ({cluster.num_nodes * cluster.gpus_per_node}): one rank per GPU")
        ranks = cluster.gpus_per_node
    elif cluster.trainer_ranks % cluster.num_nodes:
        raise SlurmPlanError(f"cluster.trainer_ranks ({cluster.trainer_ranks}) must be a multiple of "
                             f"cluster.num_nodes ({cluster.num_nodes}): every node runs as many ranks")
    else:
        ranks = cluster.trainer_ranks // cluster.num_nodes
    services = cfg.service_plan
    generators = services.generator_services
    gen_nodes, per_node, gen_gpus = _generator_nodes(cfg, generators)
    tasks = tuple(t for t in services.reward_tasks if not cfg.env[t].external)
    return Layout(cluster.num_nodes, ranks, cluster.gpus_per_node, generators, gen_nodes, per_node, gen_gpus, tasks)


def _generator_nodes(cfg: ExperimentConfig, generators: int) -> tuple[int, int, int]:
    """(generator nodes, generators per node, GPUs per generator). The nodes come from
    policy.generation.colocated.resources (NeMo-RL's keys for dedicated generators), else
    as many GPU nodes as the generators fill at one GPU per vLLM worker (vllm_cfg tensor x pipeline
    parallel sizes), else one CPU node."""
    if not generators:
        return 0, 0, 0
    resources = cfg.policy.generation.colocated.resources
    node_gpus = resources.gpus_per_node if resources.gpus_per_node is not None else cfg.cluster.gpus_per_node
    each = cfg.policy.generation.vllm_cfg.num_workers
    nodes = resources.num_nodes or (math.ceil(generators * each / node_gpus) if node_gpus else 1)
    if node_gpus and not cfg.cluster.gpus_per_node:
        raise SlurmPlanError("GPU generators with a CPU trainer: one job asks the same GPUs of every node; set "
                             "cluster.gpus_per_node, or leave policy.generation.colocated.resources.gpus_per_node unset")
    per_node = math.ceil(generators / nodes)
    if node_gpus and per_node * each > node_gpus:
        raise SlurmPlanError(f"{generators} generators on {nodes} node(s) of {node_gpus} GPUs do not fit ({each} GPU(s) "
                             "each): raise policy.generation.colocated.resources.num_nodes or lower cluster.num_generators")
    return nodes, per_node, each if node_gpus else 0


def _header(options: Options, name: str, log: str, resources: list[str]) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", *(f"#SBATCH {r}" for r in resources),
             f"#SBATCH --output={options.logs / log}", "#SBATCH --open-mode=append",
             f"#SBATCH --chdir={options.workdir}"]
    lines += [f"#SBATCH --{key}={value}" for key, value in (("partition", options.partition),
              ("account", options.account), ("time", options.time_limit)) if value]
    return lines + [f"#SBATCH {arg}" for arg in options.sbatch_args]


def _environment(options: Options) -> list[str]:
    """Shell lines every script starts with: the experiment and the token file, no secret in argv."""
    q = shlex.quote
    config = options.run_dir / "slurm" / "experiment.yaml" if options.config else ""
    return [
        "set -uo pipefail",
        f"run={q(str(options.run_dir))}",
        f"py={q(options.python)}",
        'logs="$run/slurm/logs"',
        "unset TANDEM_TOKEN  # every step reads the run's own token file (mode 0600)",
        'export TANDEM_TOKEN_FILE="$run/token"',
        f"export TANDEM_CONFIG={q(str(config))}",
        f"export TANDEM_OVERRIDES={q(shlex.join(options.overrides))}",
        'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHONUNBUFFERED=1',
        f'export {HUGE_PAGES_VAR}="${{{HUGE_PAGES_VAR}:-1}}"  # huge pages for tensors (tandem/host_memory.py)',
    ]


def _trainer_step(layout: Layout, options: Options) -> str:
    gpus = [f"--gpus-per-node={layout.trainer_gpus_per_node}"] if layout.trainer_gpus_per_node else []
    srun = ["srun", "--overlap", f"--nodes={layout.trainer_nodes}", f"--ntasks={layout.trainer_nodes}",
            "--ntasks-per-node=1", "--relative=0", *gpus, '--output="$logs/trainer-%j.$restart-%N.log"', "--open-mode=append"]
    service = ['"$py"', "-m", "coordinator.cli.container", "trainer", '--coordinator "$coordinator"', "--port 0",
               f"--ranks {layout.ranks_per_node}", f"--nnodes {layout.trainer_nodes}",
               f'--rdzv-endpoint "${{nodes[0]}}:{options.rdzv_port}"', '--rdzv-id "$SLURM_JOB_ID-$restart"']
    return f"step {' '.join(srun)} {' '.join(service)}"


def _generator_steps(layout: Layout, options: Options) -> list[str]:
    steps = []
    for index in range(layout.num_generators):
        node = layout.trainer_nodes + index // layout.generators_per_node
        place = (["--exact", f"--gpus-per-task={layout.gpus_per_generator}",
                  f"--cpus-per-task={options.cpus_per_generator}"] if layout.gpus_per_generator else ["--overlap"])
        srun = ["srun", *place, "--nodes=1", "--ntasks=1", f"--relative={node}",
                f'--output="$logs/generator-{index}-%j.$restart.log"', "--open-mode=append"]
        steps.append(f"step {' '.join(srun)} \"$py\" -m coordinator.cli.container generator "
                     f"--coordinator \"$coordinator\" --port 0 --index {index}")
    return steps


def _reward_steps(layout: Layout) -> list[str]:
    gres = ["--gres=none"] if layout.gpus else []
    return [f"step srun --overlap --nodes=1 --ntasks=1 --relative=0 {' '.join(gres)}{' ' if gres else ''}"
            f"--output=\"$logs/reward-{task}-%j.$restart.log\" --open-mode=append \"$py\" -m coordinator.cli.container reward "
            f"--task {shlex.quote(task)} --coordinator \"$coordinator\" --port 0" for task in layout.tasks]


STOP_STEPS = """stop_steps() {  # SIGTERM to every step's tasks (not to this script): the services drain and exit
  scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
  for _ in $(seq 60); do
    running=0; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    [ "$running" = 0 ] && return; sleep 1
  done
}"""


WAIT_PORT = """wait_port() {  # a requeue: the last incarnation's coordinator must be gone before any service starts
  for waited in $(seq 0 120); do
    (exec 3<>"/dev/tcp/${nodes[0]}/$1") 2>/dev/null || return 0; sleep 1
  done
  echo "tandem: port $1 of ${nodes[0]} is still taken after ${waited}s" >&2
}"""


def run_script(layout: Layout, options: Options) -> str:
    """The batch script of a whole run (resubmitting it, or a requeue, resumes the run)."""
    resources = [f"--nodes={layout.nodes}", "--ntasks-per-node=1", "--requeue" if options.requeue else "--no-requeue"]
    if layout.trainer_gpus_per_node:
        resources += [f"--gpus-per-node={layout.trainer_gpus_per_node}", "--exclusive"]
    elif layout.gpus_per_generator:
        resources += ["--exclusive"]
    address = f"$run/slurm/{ADDRESS_FILE}"
    lines = [*_header(options, options.job_name, "batch-%j.log", resources),
             f"# Tandem run {options.run_name}, written by `tandem slurm`. `sbatch` this file again (or a requeue)",
             "# resumes the run from its last checkpoint. Per-step logs: <run>/slurm/logs/.",
             *_environment(options),
             'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))  # node 0 is this batch host',
             'restart="${SLURM_RESTART_COUNT:-0}"',
             f'coordinator="${{nodes[0]}}:{options.port}"',
             f'echo "$coordinator" > "{address}.tmp" && mv -f "{address}.tmp" "{address}"  # for joining generators',
             'echo "tandem: job $SLURM_JOB_ID restart $restart on ${nodes[*]}; coordinator $coordinator"',
             f"{WAIT_PORT}\nwait_port {options.port}",
             "pids=()",
             'step() { "$@" < /dev/null & pids+=($!); }',
             _trainer_step(layout, options), *_generator_steps(layout, options), *_reward_steps(layout),
             "rc=0",
             f'"$py" -m coordinator.cli.container coordinator --port {options.port} || rc=$?',
             f'rm -f "{address}"',
             f'scancel --batch --signal=TERM --name={shlex.quote(options.job_name + "-gen")} --user="$(id -un)" '
             '2>/dev/null  # joined generators drain and end',
             STOP_STEPS, "stop_steps",
             'echo "tandem: coordinator exited $rc"', 'exit "$rc"']
    return "\n".join(lines) + "\n"


DRAIN = """drain() {  # `scancel --batch --signal=TERM JOB`: SIGTERM to each generator's own process, which drains
  for file in "$logs/.pid-$SLURM_JOB_ID-"*; do
    read -r node pid < "$file"
    srun --overlap --gres=none --nodes=1 --ntasks=1 -w "$node" kill -TERM "$pid" < /dev/null
  done
}"""


def join_script(layout: Layout, options: Options, count: int, wait_s: int = 600) -> str:
    """A job of `count` more generators for the run's coordinator (they leave as the module says)."""
    if not layout.num_generators:
        raise SlurmPlanError("this run has no generator services (DPO/RM, or policy.generation.backend: megatron)")
    if count < 1:
        raise SlurmPlanError(f"--join takes a number of generators >= 1, got {count}")
    resources = [f"--ntasks={count}", f"--cpus-per-task={options.cpus_per_generator}", "--no-requeue"]
    if layout.gpus_per_generator:
        resources.append(f"--gpus-per-task={layout.gpus_per_generator}")
    address = f"$run/slurm/{ADDRESS_FILE}"
    lines = [*_header(options, options.job_name + "-gen", "generators-%j.log", resources),
             f"# {count} more generator(s) for Tandem run {options.run_name}; they leave with `scancel --batch --signal=TERM JOB`",
             *_environment(options),
             f'for _ in $(seq {wait_s}); do [ -s "{address}" ] && break; sleep 1; done',
             f'[ -s "{address}" ] || {{ echo "tandem: run {options.run_name} has no coordinator up '
             f'({address} missing): submit the run first" >&2; exit 1; }}',
             f'coordinator="$(cat "{address}")"',
             'echo "tandem: job $SLURM_JOB_ID joins $coordinator with $SLURM_NTASKS generator(s)"',
             "pids=()",
             f"for i in $(seq 0 {count - 1}); do  # each generator's task notes its node and pid, then becomes it",
             '  srun --exact --nodes=1 --ntasks=1 --output="$logs/generator-join-%j-$i.log" --open-mode=append \\',
             '    sh -c \'echo "$SLURMD_NODENAME $$" > "$0"; exec "$@"\' "$logs/.pid-$SLURM_JOB_ID-$i" \\',
             '    "$py" -m coordinator.cli.container generator --coordinator "$coordinator" --port 0 \\',
             '    --index "$(( (SLURM_JOB_ID % 1000) * 100 + i + 1000 ))" < /dev/null &',
             "  pids+=($!)",
             "done",
             DRAIN, "trap drain TERM",
             'wait "${pids[@]}"; wait "${pids[@]}"  # the first wait ends when `drain` runs',
             'rm -f "$logs/.pid-$SLURM_JOB_ID-"*']
    return "\n".join(lines) + "\n"
