"""Exact resume: GRPO steps 3-4 of a run stopped after step 2 and resumed with
`Run(cfg, resume=True)` (what `tandem run --resume` does) equal those of an uninterrupted
run with the same seed, to 1e-6 (fp32, 2 trainer ranks over gloo, 1 vLLM generator).
A short SFT warm start first, so that rewards vary and every GRPO step moves the policy;
the resumed run must skip it (the checkpoint says the warm start is done)."""

import io
import json

import pytest
from rich.console import Console

from coordinator.config import load_config
from coordinator.run.grpo_run import Run
from coordinator.run.resume import NothingToResume

pytestmark = pytest.mark.integration

COMPARED = ["loss", "reward_mean", "accuracy_train", "grad_norm", "kl", "entropy", "token_mult_prob_error",
            "completion_length_mean", "weight_version", "generation_weight_version"]


def _cfg(root, name: str | None, steps: int):
    return load_config(overrides=[
        f"logger.log_dir={root}", *([f"logger.run_name={name}"] if name else []), "logger.tensorboard_enabled=false",
        "logger.plot_enabled=false", "sft.max_num_steps=60", "sft.val_period=60",
        "sft.stop_at_accuracy=null", f"grpo.max_num_steps={steps}", "grpo.val_period=0",
        "grpo.max_val_samples=8", "checkpointing.save_period=2", "data.num_train=400", "data.num_val=16",
        "cluster.num_generators=1", "cluster.trainer_ranks=2", "policy.precision=float32"])


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
    Run(_cfg(tmp_path, "resumed", 2), console).execute()  # stops after step 2 (checkpoint step_000002)
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
