"""Services that fail at start, on real processes launched as a local run launches them (torchrun
trainer, vLLM generator): the run's error is the line of the service's log that names the cause
(not a stack tail); and a healthy torchrun trainer told to stop (SIGTERM) stops cleanly, with
exit code 0 and no traceback.

The model problems here are caught by `tandem run` before anything starts
(tests/integration/test_bad_inputs.py); these services are started past those checks, as
services started by hand or by another orchestrator would be.
"""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import structlog

from coordinator.config import load_config
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.launcher import LocalLauncher, ServiceDied, ServiceSpec, python_module, torchrun_module
from coordinator.launch.local import CHILD_ENV
from coordinator.launch.specs import generator_settings, scratch_root, trainer_settings
from tests import procs

pytestmark = pytest.mark.integration

LOG = structlog.get_logger()


def _damaged_copies(root: Path) -> dict[str, Path]:
    good = ensure_tiny_model(root / "cache")
    copies = {"cfg_corrupt": lambda m: (m / "config.json").write_text('{"model_type": "llama",'),
              "cfg_empty": lambda m: (m / "config.json").write_text("{}"),
              "truncated": lambda m: os.truncate(m / "model.safetensors", 1 << 20)}  # of its 4 MB
    paths = {"good": good}
    for name, damage in copies.items():
        shutil.copytree(good, root / name)
        damage(root / name)
        paths[name] = root / name
    return paths


def _trainer(launcher: LocalLauncher, root: Path, name: str, model: Path) -> None:
    cfg = load_config(overrides=["cluster.trainer_ranks=1"])
    settings = root / f"{name}.json"
    settings.write_text(trainer_settings(cfg, str(model)).model_dump_json())
    launcher.start(ServiceSpec(name, torchrun_module("trainer_svc", 1, "--settings", str(settings),
                                                     "--address-file", str(root / f"{name}.addr"))))


def _generator(launcher: LocalLauncher, root: Path, name: str, model: Path) -> None:
    cfg = load_config(overrides=["policy.generation.vllm_cfg.kv_cache_space_gib=100000"])
    settings = root / f"{name}.json"
    settings.write_text(generator_settings(cfg, str(model), 0, scratch_root(root) / name).model_dump_json())
    launcher.start(ServiceSpec(name, python_module("generator_svc", "--settings", str(settings))))


def _died(launcher: LocalLauncher, timeout_s: float = 400) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            launcher.check()
        except ServiceDied as exc:
            return str(exc)
        time.sleep(0.5)
    raise AssertionError("the service did not fail")


def test_start_failures_show_their_cause_line_and_a_clean_stop_shows_no_traceback(tmp_path):
    models = _damaged_copies(tmp_path)
    env = {"TANDEM_TOKEN": procs.TOKEN, **CHILD_ENV}
    launchers = {name: LocalLauncher(tmp_path / name, env, LOG) for name in
                 ("cfg_corrupt", "cfg_empty", "truncated", "kv_cache", "healthy")}
    expected = {"cfg_corrupt": "config.json' is not a valid JSON file",
                "cfg_empty": "Should have a `model_type` key in its config.json",
                "truncated": "SafetensorError: Error while deserializing header",
                "kv_cache": "less than requested memory for kv (100000.0 GiB)"}
    try:
        for name in ("cfg_corrupt", "cfg_empty", "truncated"):
            _trainer(launchers[name], tmp_path, name, models[name])
        _generator(launchers["kv_cache"], tmp_path, "kv_cache", models["good"])
        _trainer(launchers["healthy"], tmp_path, "healthy", models["good"])
        for name, cause in expected.items():
            message = _died(launchers[name])
            first = message.splitlines()[0]
            assert cause in first, message
            assert "Traceback" not in message and len(message.splitlines()) == 2, message
            assert f"(its whole log: {tmp_path / name / (name + '.log')})" in message
            print(f"\n{name}: {first}")
        healthy = launchers["healthy"]
        deadline = time.monotonic() + 300
        while not (tmp_path / "healthy.addr").exists():
            healthy.check()
            assert time.monotonic() < deadline, "the healthy trainer did not start"
            time.sleep(0.5)
        pid = healthy.pids()["healthy"]
        healthy.stop_all(grace_s=60)
        log = (tmp_path / "healthy" / "healthy.log").read_text(errors="replace")
        assert "Traceback" not in log and "SignalException" not in log, log[-3000:]
        assert '"torchrun_stopped"' in log
        assert json.loads(next(line for line in log.splitlines() if '"service_stopping"' in line))["exit_code"] == 0
        assert not Path(f"/proc/{pid}").exists()
    finally:
        for launcher in launchers.values():
            launcher.stop_all(grace_s=5)
        shutil.rmtree(scratch_root(tmp_path), ignore_errors=True)
