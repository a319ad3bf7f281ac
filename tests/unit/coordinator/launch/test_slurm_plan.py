"""coordinator/launch/slurm.py: the layout a config asks of Slurm, the errors that say what to change,
and the scripts (parsed by bash itself, `bash -n`). tests/slurm runs them on a real Slurm."""

import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from coordinator.cli.slurm import parse_args, prepare
from coordinator.config import ConfigError, load_config
from coordinator.launch import slurm

# these keys size Slurm's generator nodes; the config warns that local runs ignore them
pytestmark = pytest.mark.filterwarnings("ignore:policy.generation.colocated.resources is ignored")


def _options(tmp_path: Path, **changes) -> slurm.Options:
    base = dict(run_name="r1", run_dir=tmp_path / "runs" / "r1", python="/venv/bin/python", workdir=tmp_path,
                config=None, overrides=("grpo.max_num_steps=3", "logger.run_name=r1"))
    return slurm.Options(**{**base, **changes})


def _bash_ok(script: str) -> None:
    result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_cpu_layout_puts_the_trainer_on_num_nodes_and_the_generators_on_one_more():
    cfg = load_config(None, ["cluster.num_nodes=2", "cluster.trainer_ranks=4", "cluster.num_generators=3"])
    assert slurm.plan(cfg) == slurm.Layout(trainer_nodes=2, ranks_per_node=2, trainer_gpus_per_node=0,
                                           num_generators=3, generator_nodes=1, generators_per_node=3,
                                           gpus_per_generator=0, tasks=("arithmetic",))


def test_gpu_layout_gives_each_generator_a_gpu_and_as_many_nodes_as_they_fill():
    cfg = load_config(None, ["cluster.num_nodes=2", "cluster.gpus_per_node=8", "cluster.trainer_ranks=16",
                             "cluster.num_generators=10"])
    layout = slurm.plan(cfg)
    assert (layout.ranks_per_node, layout.generator_nodes, layout.generators_per_node, layout.gpus_per_generator,
            layout.nodes) == (8, 2, 5, 1, 4)
    cfg = load_config(None, ["cluster.num_nodes=1", "cluster.gpus_per_node=8", "cluster.trainer_ranks=8",
                             "cluster.launch=external", "cluster.num_generators=4",
                             "policy.generation.colocated.resources.num_nodes=4",
                             "policy.generation.colocated.resources.gpus_per_node=1"])
    assert (slurm.plan(cfg).generator_nodes, slurm.plan(cfg).generators_per_node) == (4, 1)


@pytest.mark.parametrize("overrides, message", [
    (["cluster.num_nodes=2", "cluster.trainer_ranks=3"], "cluster.trainer_ranks (3) must be a multiple"),
    (["cluster.num_nodes=2", "cluster.gpus_per_node=8", "cluster.trainer_ranks=8"], "must be cluster.num_nodes x"),
    (["policy.generation.colocated.enabled=true"], "policy.generation.colocated.enabled"),
    (["cluster.gpus_per_node=1", "cluster.trainer_ranks=1", "cluster.num_generators=3",
      "policy.generation.colocated.resources.num_nodes=1", "policy.generation.colocated.resources.gpus_per_node=2"],
     "3 generators on 1 node"),
    (["policy.generation.colocated.resources.gpus_per_node=4"], "GPU generators with a CPU trainer"),
])
def test_configs_slurm_cannot_place_are_refused_naming_the_key(overrides, message):
    with pytest.raises(slurm.SlurmPlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        slurm.plan(load_config(None, overrides))


def test_run_script_places_each_service_and_keeps_the_token_off_command_lines(tmp_path):
    cfg = load_config(None, ["cluster.num_nodes=2", "cluster.trainer_ranks=2", "cluster.num_generators=2"])
    script = slurm.run_script(slurm.plan(cfg), _options(tmp_path))
    _bash_ok(script)
    assert "#SBATCH --nodes=3" in script and "#SBATCH --requeue" in script
    steps = [line for line in script.splitlines() if line.startswith("step srun")]
    assert len(steps) == 4  # trainer, 2 generators, 1 reward
    assert "--nodes=2 --ntasks=2 --ntasks-per-node=1 --relative=0" in steps[0] and "--ranks 1 --nnodes 2" in steps[0]
    assert ["--relative=2" in s for s in steps[1:3]] == [True, True] and "--relative=0" in steps[3]
    assert 'export TANDEM_TOKEN_FILE="$run/token"' in script and "unset TANDEM_TOKEN" in script
    exported = next(line for line in script.splitlines() if line.startswith("export TANDEM_OVERRIDES="))
    assert shlex.split(exported.partition("=")[2]) == ["grpo.max_num_steps=3 logger.run_name=r1"]


def test_gpu_run_script_asks_for_gpus_and_binds_one_to_each_generator(tmp_path):
    cfg = load_config(None, ["cluster.num_nodes=1", "cluster.gpus_per_node=8", "cluster.trainer_ranks=8",
                             "cluster.launch=external", "cluster.num_generators=2"])  # as `tandem slurm` loads it
    script = slurm.run_script(slurm.plan(cfg), _options(tmp_path, partition="gpu", time_limit="12:00:00",
                                                          sbatch_args=("--mem=0",)))
    _bash_ok(script)
    for line in ("#SBATCH --gpus-per-node=8", "#SBATCH --exclusive", "#SBATCH --partition=gpu",
                 "#SBATCH --time=12:00:00", "#SBATCH --mem=0"):
        assert line in script
    assert script.count("--exact --gpus-per-task=1") == 2 and "--gres=none" in script


def test_join_script_waits_for_the_coordinator_and_drains_on_a_batch_signal(tmp_path):
    cfg = load_config(None, ["cluster.num_generators=2"])
    script = slurm.join_script(slurm.plan(cfg), _options(tmp_path), count=3)
    _bash_ok(script)
    assert "#SBATCH --job-name=tandem-r1-gen" in script and "#SBATCH --ntasks=3" in script
    assert "trap drain TERM" in script and 'kill -TERM "$pid"' in script
    with pytest.raises(slurm.SlurmPlanError, match="no generator services"):
        slurm.join_script(slurm.plan(load_config(None, ["policy.generation.backend=megatron",
                                                        "policy.megatron_cfg.enabled=true",
                                                        "policy.dtensor_cfg.enabled=false"])), _options(tmp_path), 1)


def test_tandem_slurm_writes_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "exp.yaml"
    config.write_text("grpo:\n  max_num_steps: 3\n")
    script, name = prepare(parse_args([str(config), "logger.log_dir=runs", "cluster.num_generators=2"]))
    run_dir = tmp_path / "runs" / name
    assert script == run_dir / "slurm" / "run.sbatch" and (run_dir / "slurm" / "experiment.yaml").read_text() == \
        config.read_text()
    assert (run_dir / "token").stat().st_mode & 0o777 == 0o600
    assert f"logger.run_name={name}" in script.read_text()
    with pytest.raises(slurm.SlurmPlanError, match="logger.run_name"):
        prepare(parse_args(["logger.log_dir=runs", "--join", "1"]))
    join, _ = prepare(parse_args([f"logger.run_name={name}", "logger.log_dir=runs", "--join", "2"]))
    assert join.parent == run_dir / "slurm" and join.name.startswith("join-")


def test_a_requeued_run_starts_its_services_only_once_the_last_coordinator_let_go_of_its_port(tmp_path):
    """The run script's wait_port, against a real listener on this host that closes after a while."""
    script = slurm.run_script(slurm.plan(load_config(None, [])), _options(tmp_path))
    assert script.index("wait_port 50051") < script.index("step srun")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    threading.Timer(1.5, listener.close).start()
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", f"nodes=(127.0.0.1)\n{slurm.WAIT_PORT}\nwait_port {port} && echo free"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout == "free\n" and time.monotonic() - started >= 1.0, (done.stdout, done.stderr)


def test_tandem_slurm_places_generators_on_nodes_of_their_own_not_on_the_trainers_gpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    layout = ["cluster.gpus_per_node=8", "cluster.num_generators=2",
              "policy.generation.vllm_cfg.tensor_parallel_size=2"]
    with pytest.raises(ConfigError, match="dedicated generators do not fit"):  # one node, local launch: 8 + 4 GPUs
        load_config(None, layout)
    script, _ = prepare(parse_args([*layout, "logger.log_dir=runs"]))
    text = script.read_text()
    assert "#SBATCH --gpus-per-node=8" in text and "--gpus-per-task=2" in text
