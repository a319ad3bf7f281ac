"""Exact resume: GRPO steps 3-4 of a run stopped after step 2 and resumed with
`Run(cfg, resume=True)` (what `tandem run --resume` does) equal those of an uninterrupted
run with the same seed, to 1e-6 (fp32, 2 trainer ranks over gloo, 1 vLLM generator). The
stopped run is the uninterrupted one's directory as a crash right after its step-2 checkpoint
leaves it (`latest` names step 2, no later checkpoint, no summary.json, metrics.jsonl and the
logs as they were): the resume must drop the rows logged after the checkpoint itself.
A short SFT warm start first, so that rewards vary and every GRPO step moves the policy;
the resumed run must skip it (the checkpoint says the warm start is done).

`tandem export` on the uninterrupted run: its last checkpoint, exported by a trainer started
for it alone, holds exactly the weights the run exported at its end (<run>/hf)."""

import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from coordinator.checkpoint.resume import NothingToResume
from coordinator.config import load_config
from coordinator.run.grpo_run import Run

pytestmark = pytest.mark.integration

COMPARED = ["loss", "reward_mean", "accuracy_train", "grad_norm", "kl", "entropy", "token_mult_prob_error",
            "completion_length_mean", "weight_version", "generation_weight_version"]


def _cfg(root, name: str | None, steps: int):
    return load_config(overrides=[
        f"logger.log_dir={root}", *([f"logger.run_name={name}"] if name else []), "logger.tensorboard_enabled=false",
        "logger.plot_enabled=false", "sft.max_num_steps=60", "sft.val_period=60",
        "sft.stop_at_accuracy=null", f"grpo.max_num_steps={steps}", "grpo.val_period=0",
        "grpo.max_val_samples=8", "checkpointing.save_period=2", "data.num_train=400", "data.num_val=16",
        "cluster.num_generators=1", "cluster.trainer_ranks=2", "policy.precision=float32", "grpo.num_prompts_per_step=16"])


def _grpo_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "grpo"]


def _events(run_dir, nth_start: int) -> set[str]:
    """The events of the nth_start-th coordinator session in the run's log (1-based)."""
    sessions, events = 0, set()
    for line in (run_dir / "logs" / "coordinator.log").read_text().splitlines():
        event = json.loads(line)["event"]
        if event == "service_started" and "trainer" in line:
            sessions += 1
        if sessions == nth_start:
            events.add(event)
    return events


def test_steps_after_a_resume_equal_an_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    console = Console(file=io.StringIO())
    with pytest.raises(NothingToResume, match="logger.run_name"):
        Run(_cfg(tmp_path, None, 4), console, resume=True)
    with pytest.raises(NothingToResume, match="no complete checkpoint"):
        Run(_cfg(tmp_path, "never-ran", 4), console, resume=True)
    assert not (tmp_path / "never-ran").exists()

    straight = Run(_cfg(tmp_path, "straight", 4), console).execute()
    _as_if_it_crashed_after_step_2(tmp_path / "straight", tmp_path / "resumed")
    resumed = Run(_cfg(tmp_path, "resumed", 4), console, resume=True).execute()
    print(f"\ntimings straight: {straight['timings_s']}\ntimings resumed: {resumed['timings_s']}")

    a, b = _grpo_rows(tmp_path / "straight"), _grpo_rows(tmp_path / "resumed")
    assert [r["step"] for r in a] == [1, 2, 3, 4] and [r["step"] for r in b] == [1, 2, 3, 4]
    # the policy moves before the checkpoint and after the resume: the comparison means something
    assert a[0]["grad_norm"] > 0 and a[1]["grad_norm"] > 0 and a[2]["grad_norm"] > 0 and a[2]["reward_mean"] > 0
    for ra, rb in zip(a, b):
        assert {"loss", "reward_mean", "grad_norm"} <= set(ra)
        for key in (k for k in COMPARED if k in ra):
            assert abs(ra[key] - rb[key]) <= 1e-6, (ra["step"], key, ra[key], rb[key])
    assert resumed["weight_version"] == straight["weight_version"]
    assert resumed["sft_steps"] == straight["sft_steps"] == 60 and "warm_start_done" not in _events(tmp_path / "resumed", 2)
    assert "resume_s" in resumed["timings_s"] and "checkpoint_s" in straight["timings_s"]
    _assert_export_of_the_last_checkpoint_is_the_runs_model(tmp_path / "straight", tmp_path / "home", tmp_path)


def _as_if_it_crashed_after_step_2(run_dir, copy) -> None:
    """The rows logged after the checkpoint stay, poisoned (NaN): equal rows after the resume can
    only come from steps it trained again, not from the copy."""
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("summary.json", "hf", "step_000004"))
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4
    nan = dict.fromkeys(COMPARED, float("nan"))
    poisoned = [{**r, **nan} if r["phase"] == "grpo" and r["step"] > 2 else r for r in rows]
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in poisoned))
    (copy / "checkpoints" / "latest").write_text("step_000002")


def _tandem_export(*args: str, home) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_HOME": str(home)}
    env.pop("TANDEM_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "coordinator.cli.main", "export", *args], env=env, text=True, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)


def _assert_export_of_the_last_checkpoint_is_the_runs_model(run_dir, home, tmp_path) -> None:
    missing = _tandem_export(str(run_dir), str(tmp_path / "nope"), "--step", "3", home=home)
    assert missing.returncode == 2 and "complete ones: [2, 4]" in missing.stdout and "Traceback" not in missing.stdout
    for step in ("2", "4"):
        done = _tandem_export(str(run_dir), str(tmp_path / f"export-{step}"), "--step", step, home=home)
        assert done.returncode == 0, done.stdout
    final, step4, step2 = (load_file(d / "model.safetensors")
                           for d in (run_dir / "hf", tmp_path / "export-4", tmp_path / "export-2"))
    assert final.keys() == step4.keys()
    assert all(torch.equal(final[k], step4[k]) for k in final)
    assert any(not torch.equal(step2[k], step4[k]) for k in step4)  # the step chosen is the one exported
    assert not (run_dir / "exports").exists() or not any((run_dir / "exports").iterdir())


def _async_cfg(root, steps: int):
    return load_config(overrides=[
        f"logger.log_dir={root}", "logger.run_name=async", "logger.tensorboard_enabled=false",
        "logger.plot_enabled=false", "sft.max_num_steps=0", f"grpo.max_num_steps={steps}", "grpo.val_period=0",
        "grpo.val_at_start=false", "grpo.max_val_samples=8", "checkpointing.save_period=2", "data.num_train=400",
        "data.num_val=16", "cluster.num_generators=1", "grpo.async_grpo.enabled=true",
        "grpo.async_grpo.max_trajectory_age_steps=1", "grpo.num_prompts_per_step=8",
        "policy.train_global_batch_size=64", "policy.train_micro_batch_size=64"])


def test_async_run_checkpoints_the_cursor_of_the_step_trained_and_resumes(tmp_path, monkeypatch):
    """Async GRPO draws the next step's prompts before a checkpoint: the checkpoint keeps the
    cursor after the step it trained, so a resume samples the prompts that were in flight again."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    console = Console(file=io.StringIO())
    Run(_async_cfg(tmp_path, 2), console).execute()
    run_dir = tmp_path / "async"
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "coordinator.json").read_text())
    first = _grpo_rows(run_dir)
    assert [r["stale_groups_dropped"] for r in first] == [0.0, 0.0]
    assert state["cursor"] == {"epoch": 0, "position": 2 * 8}  # not the third batch's, drawn ahead
    (run_dir / "summary.json").unlink()  # as if it had stopped there

    resumed = Run(_async_cfg(tmp_path, 4), console, resume=True).execute()
    rows = _grpo_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [(r["loss"], r["reward_mean"]) for r in rows[:2]] == [(r["loss"], r["reward_mean"]) for r in first]
    assert all(r["trajectory_age_max"] <= 1 for r in rows) and "resume_s" in resumed["timings_s"]
    assert [r["weight_version"] for r in rows] == sorted(r["weight_version"] for r in rows)
    assert resumed["weight_version"] > state["weight_version"]
