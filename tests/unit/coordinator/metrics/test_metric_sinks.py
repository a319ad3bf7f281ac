"""The metric sinks for real (TensorBoard, W&B offline, an MLflow file store): the same scalars
under the same names at each phase's own steps, even as phases count from 1 again (W&B keeps
one monotonic step per run), the config, and the sample generations."""

import json

import pytest

from coordinator.config.run import LoggerConfig
from coordinator.metrics.log import MetricsLog
from coordinator.metrics.plot import build_figure, plot_run
from tests.metric_readers import (
    mlflow_artifacts,
    mlflow_scalars,
    tensorboard_scalars,
    tensorboard_texts,
    wandb_history,
    wandb_scalars,
)

ROWS = [("sft", 50, {"loss": 2.5}), ("sft_val", 50, {"accuracy": 0.1}), ("sft", 100, {"loss": 1.5}),
        ("sft_val", 100, {"accuracy": 0.5}), ("val", 0, {"accuracy": 0.5}),
        ("grpo", 1, {"loss": 0.25, "reward_mean": 0.5, "reward_mean/arithmetic": 0.5, "kl": 0.01}),
        ("grpo", 2, {"loss": 0.125, "reward_mean": 0.75, "reward_mean/arithmetic": 0.75, "kl": 0.02}),
        ("val", 2, {"accuracy": 0.75})]
SAMPLES = [{"task": "arithmetic", "prompt": "1+2=", "completion": "3", "answer": "3", "reward": 1.0, "correct": True}]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sinks") / "demo-run"
    run_dir.mkdir()
    cfg = LoggerConfig(wandb_enabled=True, mlflow_enabled=True, wandb={"mode": "offline"})
    metrics = MetricsLog(run_dir, cfg, "demo-run")
    metrics.log_config({"grpo": {"max_num_steps": 2}, "policy": {"model_name": None}})
    for phase, step, row in ROWS:
        metrics.log(phase, step, row)
    metrics.log_samples("val", 2, SAMPLES)
    metrics.close()
    return run_dir


def test_every_sink_has_the_same_scalars_at_each_phases_steps(run_dir):
    expected = {(f"{phase}/{key}", step): value for phase, step, row in ROWS for key, value in row.items()}
    assert tensorboard_scalars(run_dir / "tensorboard") == pytest.approx(expected)
    assert wandb_scalars(run_dir) == pytest.approx(expected)
    assert mlflow_scalars(run_dir / "mlruns") == pytest.approx(expected)
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == \
        [step for _, step, _ in ROWS]


def test_sample_generations_reach_every_sink(run_dir):
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert rows == [{"phase": "val", "step": 2, **SAMPLES[0]}]
    assert "val/samples/text_summary" in tensorboard_texts(run_dir / "tensorboard")
    tables = [row for row in wandb_history(run_dir) if "val/samples._type" in row]
    assert tables and tables[0]["val/samples._type"] == "table-file" and tables[0]["val/step"] == 2
    assert "samples/val-step000002.jsonl" in mlflow_artifacts(run_dir / "mlruns")


def test_a_sink_that_fails_is_dropped_and_the_run_goes_on(tmp_path):
    failures = []
    metrics = MetricsLog(tmp_path, LoggerConfig(tensorboard_enabled=True), on_sink_error=lambda n, e: failures.append(n))

    class Broken:
        def scalars(self, *args):
            raise OSError("disk full")

    metrics._sinks.insert(0, Broken())
    metrics.log("grpo", 1, {"loss": 1.0})
    metrics.log("grpo", 2, {"loss": 0.5})
    metrics.close()
    assert failures == ["Broken"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert tensorboard_scalars(tmp_path / "tensorboard") == {("grpo/loss", 1): 1.0, ("grpo/loss", 2): 0.5}


def test_the_plot_has_a_column_per_phase_named_axes_and_the_run_name(tmp_path):
    history = [{"phase": phase, "step": step, **row} for phase, step, row in ROWS]
    fig = build_figure(history, "demo-run")
    assert fig._suptitle.get_text() == "demo-run"
    axes = fig.axes
    assert [a.get_title() for a in axes[:2]] == ["SFT", "GRPO"]
    assert [a.get_xlabel() for a in axes if a.axison and a.get_xlabel()] == ["SFT step", "GRPO step"]
    assert not axes[4].axison  # SFT has no KL: its panel is left out, its step axis named on the panel above
    labels = {a.get_ylabel(): [line.get_label() for line in a.get_lines()] for a in axes[1::2]}  # the GRPO column
    assert labels == {"loss": ["training loss"], "reward / accuracy": ["reward (mean)", "held-out accuracy"],
                      "KL to the reference": ["KL"]}
    dpo = [{"phase": "dpo", "step": s, "loss": 1 / s, "accuracy": 0.5} for s in (1, 2)]
    fig = build_figure(dpo + [{"phase": "val", "step": 2, "accuracy": 0.6}], "dpo-run")
    assert [a.get_xlabel() for a in fig.axes] == ["", "DPO step"] and fig.axes[1].get_ylabel() == "reward / accuracy"
    assert plot_run(history, tmp_path / "curves.png", "demo-run").stat().st_size > 10_000


def test_a_logger_that_cannot_start_is_one_error_naming_its_key(tmp_path, monkeypatch):
    from coordinator.metrics.sinks import SinkError

    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B login to find
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    with pytest.raises(SinkError, match=r"logger\.wandb_enabled: .*logger\.wandb\.mode=offline"):
        MetricsLog(tmp_path, LoggerConfig(tensorboard_enabled=False, wandb_enabled=True))
