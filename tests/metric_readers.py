"""Reading back what a run's metric sinks wrote, as {(name, step): value}, for tests that
compare them: TensorBoard event files, a W&B offline run (through `wandb leet inspect --json`,
W&B's own reader of its transaction log) and an MLflow file store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def tensorboard_scalars(log_dir: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}


def tensorboard_texts(log_dir: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    return list(events.Tags()["tensors"])


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of the (one) offline W&B run under run_dir/wandb."""
    [path] = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(path)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r["history"]["item"] for r in records if r.get("type") == "history"]


def wandb_scalars(run_dir: Path) -> dict[tuple[str, int], float]:
    """Each phase's scalars at that phase's own step metric (`<phase>/step`)."""
    scalars = {}
    for row in wandb_history(run_dir):
        for key, value in row.items():
            phase = key.split("/")[0]
            if (key.startswith("_") or key.endswith("/step") or "/samples" in key  # a table's own fields
                    or not isinstance(value, (int, float))):
                continue
            scalars[(key, int(row[f"{phase}/step"]))] = float(value)
    return scalars


def mlflow_scalars(tracking_dir: Path) -> dict[tuple[str, int], float]:
    """Every metric of the (one) run in the file store, its name mapped back to TensorBoard's."""
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=tracking_dir.resolve().as_uri())
    [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
    [run] = client.search_runs([experiment.experiment_id])
    scalars = {}
    for key in run.data.metrics:
        phase, _, name = key.partition("/")
        for metric in client.get_metric_history(run.info.run_id, key):
            scalars[(f"{phase}/{name.replace('.', '/')}", metric.step)] = metric.value
    return scalars


def mlflow_artifacts(tracking_dir: Path) -> list[str]:
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=tracking_dir.resolve().as_uri())
    [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
    [run] = client.search_runs([experiment.experiment_id])
    return [f.path for folder in client.list_artifacts(run.info.run_id) for f in
            client.list_artifacts(run.info.run_id, folder.path)]
