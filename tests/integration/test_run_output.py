"""What a short `tandem run` shows and keeps when its output is piped (as in CI, `| tee` or
`docker logs`): timestamped progress lines that arrive while it starts its services, during SFT
and during GRPO; every line of every service log is JSON; the same scalars in TensorBoard, a W&B
offline run and an MLflow file store, each phase at its own steps; sample generations; and
`tandem eval` on the run's loop checkpoint and on an HF model."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.metric_readers import mlflow_scalars, tensorboard_scalars, wandb_scalars

pytestmark = pytest.mark.integration
JOB = ["sft.max_num_steps=40", "sft.val_period=20", "grpo.max_num_steps=2", "grpo.num_prompts_per_step=16", "grpo.val_period=1",
       "grpo.max_val_samples=32", "checkpointing.save_period=2", "logger.log_dir=runs", "logger.run_name=piped",
       "logger.wandb_enabled=true", "logger.wandb.mode=offline", "logger.mlflow_enabled=true",
       "logger.num_val_samples_to_print=4"]
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (.*)$")


def _tandem(*args: str, cwd: Path, home: Path) -> tuple[int, list[tuple[float, str]]]:
    """Run `tandem` with stdout and stderr piped; (exit code, [(arrival time, line)])."""
    env = {**os.environ, "TANDEM_HOME": str(home), "OMP_NUM_THREADS": "1", "TANDEM_PROGRESS_INTERVAL_S": "5"}
    env.pop("TANDEM_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli.main", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), ln.rstrip("\n")) for ln in proc.stdout))
    reader.start()
    try:
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=30)
    return code, lines


@pytest.fixture(scope="module")
def piped(tmp_path_factory):
    root = tmp_path_factory.mktemp("piped")
    code, lines = _tandem("run", *JOB, cwd=root, home=root / "home")
    return code, lines, root / "runs" / "piped", root


def _first(lines, pattern: str) -> float:
    times = [t for t, line in lines if re.search(pattern, line)]
    assert times, f"no line matches {pattern!r}:\n" + "\n".join(line for _, line in lines)
    return times[0]


def test_progress_lines_arrive_during_start_up_sft_and_grpo(piped):
    code, lines, _, _ = piped
    text = "\n".join(line for _, line in lines)
    assert code == 0, text
    assert "━" not in text  # no bar drawn at the end instead
    progress = [STAMP.match(line).group(1) for _, line in lines if STAMP.match(line)]
    waits = [p for p in progress if re.match(r"starting services .*\(\d+s\): trainer [01]/1, generators [01]/1", p)]
    assert len(waits) >= 2, text  # one at once, then one every TANDEM_PROGRESS_INTERVAL_S while services start
    up, first, sft, grpo, end = (_first(lines, p) for p in (
        r"services up in", r"first sft steps? [\d-]+ done \d+\.\ds after the run began", r"sft step 20/40",
        r"grpo step 1/2", r"held-out accuracy: .* before GRPO"))
    assert _first(lines, r"starting services") < up < first < sft < grpo < end  # each arrived as it happened
    assert end - sft > 1.0  # the SFT line was not flushed at the end with everything else
    for pattern in (r"held-out check at SFT step 40: accuracy", r"checkpoint at GRPO step 2",
                    r"grpo step 2/2 \(100%\)"):
        _first(lines, pattern)


def test_every_line_of_every_service_log_is_json(piped):
    _, _, run_dir, _ = piped
    logs = sorted((run_dir / "logs").glob("*.log"))
    assert {p.stem for p in logs} == {"coordinator", "trainer", "generator-0", "reward-arithmetic"}
    for path in logs:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert isinstance(json.loads(line), dict), f"{path.name}:{number} is not JSON: {line[:200]}"


def test_metrics_are_logged_at_each_phases_steps_with_step_and_reward_times(piped):
    _, _, run_dir, _ = piped
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "sft_val"] == [20, 40]  # SFT steps, not 0
    assert [r["step"] for r in rows if r["phase"] == "sft"] == [20, 40]
    val = [r for r in rows if r["phase"] == "val"]
    assert [r["step"] for r in val] == [0, 1, 2] and all("reward_mean" in r for r in val)  # the same keys each time
    grpo = [r for r in rows if r["phase"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2] and all(r["time_step_s"] > r["time_reward_s"] > 0 for r in grpo)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["timings_s"]["val_s"] > 0 and summary["timings_s"]["grpo_s"] > 0


def test_wandb_and_mlflow_have_the_scalars_tensorboard_has_at_the_same_steps(piped):
    _, _, run_dir, _ = piped
    board = tensorboard_scalars(run_dir / "tensorboard")
    assert ("sft_val/accuracy", 40) in board and ("grpo/reward_mean", 2) in board and ("val/accuracy", 2) in board
    assert wandb_scalars(run_dir) == pytest.approx(board)
    assert mlflow_scalars(run_dir / "mlruns") == pytest.approx(board)


def test_sample_generations_of_each_validation_are_kept(piped):
    _, _, run_dir, _ = piped
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    by_check = {}
    for row in rows:
        by_check.setdefault((row["phase"], row["step"]), []).append(row)
    assert sorted(by_check) == [("sft_val", 20), ("sft_val", 40), ("val", 1), ("val", 2)]
    assert all(len(v) == 4 for v in by_check.values())
    assert set(rows[0]) == {"phase", "step", "task", "prompt", "completion", "answer", "reward", "correct"}


def test_eval_of_the_runs_loop_checkpoint_and_of_an_hf_model(piped):
    _, _, run_dir, root = piped
    checkpoint = run_dir / "checkpoints" / "step_000002"
    code, lines = _tandem("eval", "--checkpoint", str(checkpoint), "grpo.max_val_samples=32", "logger.log_dir=runs",
                          "logger.run_name=eval-ckpt", cwd=root, home=root / "home")
    text = "\n".join(line for _, line in lines)
    assert code == 0, text
    summary = json.loads((root / "runs" / "eval-ckpt" / "summary.json").read_text())
    after = json.loads((run_dir / "summary.json").read_text())["accuracy_after"]
    assert summary["accuracy"] == pytest.approx(after) and summary["num_samples"] == 32  # greedy: the same answers
    assert re.search(r"held-out accuracy of .*step_000002: [\d.]+% \(32 samples\)", text)
    code, lines = _tandem("eval", "grpo.max_val_samples=16", "logger.log_dir=runs", "logger.run_name=eval-hf",
                          cwd=root, home=root / "home")
    text = "\n".join(line for _, line in lines)
    assert code == 0, text
    started = {json.loads(line).get("name") for line in (root / "runs" / "eval-hf" / "logs" / "coordinator.log")
               .read_text().splitlines() if '"service_started"' in line}
    assert started == {"generator-0", "reward-arithmetic"}  # no trainer: vLLM serves the checkpoint itself
    assert json.loads((root / "runs" / "eval-hf" / "summary.json").read_text())["num_samples"] == 16
