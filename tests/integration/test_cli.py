"""`tandem run` as a user runs it: a short real job, a malformed config, and Ctrl-C."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests import procs

pytestmark = pytest.mark.integration


# `python -m coordinator.cli.main`, with Ctrl-C a KeyboardInterrupt as from a terminal: a suite started
# as a background job of a script inherits SIGINT ignored, and Python keeps an inherited SIG_IGN.
def _service_pids(run_dir: Path) -> dict[str, int]:
    pids = {}
    for line in (run_dir / "logs" / "coordinator.log").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "service_started":
            pids[event["name"]] = event["pid"]
    return pids


def test_malformed_config_is_one_clear_error_and_starts_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  num_prompts_per_stepp: 4\n")
    proc = procs.tandem_cli("run", str(bad), "logger.log_dir=runs", cwd=tmp_path, home=tmp_path / "home")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "grpo.num_prompts_per_stepp" in out and "Traceback" not in out
    assert not (tmp_path / "runs").exists()  # nothing was launched
    proc = procs.tandem_cli("run", "policy.model_name=/no/such/model", cwd=tmp_path, home=tmp_path / "home")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "policy.model_name" in out


def test_short_job_writes_summary_plot_checkpoint_and_stops_everything(tmp_path):
    proc = procs.tandem_cli("run", "sft.max_num_steps=40", "sft.val_period=20", "grpo.max_num_steps=2", "grpo.val_period=1",
                   "grpo.max_val_samples=32", "checkpointing.save_period=2", "logger.log_dir=runs",
                   "logger.run_name=short", "grpo.num_prompts_per_step=16", cwd=tmp_path, home=tmp_path / "home")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    run_dir = tmp_path / "runs" / "short"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == 2 and summary["samples"] == 2 * 16 * 8
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert "held-out accuracy" in out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "grpo"] == [1, 2]
    assert (run_dir / "curves.png").stat().st_size > 1000
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    assert (run_dir / "checkpoints" / "step_000002" / "coordinator.json").is_file()
    pids = _service_pids(run_dir)
    assert set(pids) == {"trainer", "generator-0", "reward-arithmetic"}
    assert not [name for name, pid in pids.items() if procs.alive(pid)]


def test_ctrl_c_stops_every_service(tmp_path):
    proc = procs.tandem_cli("run", "logger.log_dir=runs", "logger.run_name=interrupted", cwd=tmp_path,
                   home=tmp_path / "home")
    log = tmp_path / "runs" / "interrupted" / "logs" / "coordinator.log"
    deadline = time.monotonic() + 300
    while not (log.exists() and '"event": "step"' in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(1)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    pids = _service_pids(tmp_path / "runs" / "interrupted")
    assert len(pids) == 3 and not [name for name, pid in pids.items() if procs.alive(pid)]
