"""The TRL side of benchmarks/vs_trl.py: one GRPO training with Hugging Face TRL's GRPOTrainer.

    python benchmarks/vs_trl_trl.py SPEC.json      # run by benchmarks/vs_trl.py, one process per rep

SPEC.json names the start checkpoint, the training JSONL, the GRPOConfig keyword arguments
(benchmarks/vs_trl_settings.py), where to save the final model and where to write the figures.
The reward is TRL's reward-function API over the exact-match scorer of Tandem's arithmetic env
(coordinator/embedded/arithmetic.py). A callback records each step's begin and end times;
generation (`_generate_single_turn`) and everything before the loss (`_generate_and_score_completions`:
generation, rewards, advantages, reference logprobs) are timed by a subclass.

Needs the `bench` extra (`pip install -e '.[bench]'`, i.e. trl); tests never import this file.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_bench import RunFigures, median

from coordinator.embedded.arithmetic import exact_match, read_jsonl


def exact_match_reward(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """TRL reward function: 1.0 when the completion is exactly the answer (Tandem's `exact` scorer)."""
    return [exact_match(completion, truth) for completion, truth in zip(completions, answer)]


def _timed_trainer_class():
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that adds up, per optimizer step, the seconds spent generating and preparing."""

        phase_s: ClassVar[dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(float))

        def _generate_single_turn(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                self.phase_s["generate"][self.state.global_step] += time.perf_counter() - started

        def _generate_and_score_completions(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*args, **kwargs)
            finally:
                self.phase_s["prepare"][self.state.global_step] += time.perf_counter() - started

    return TimedGRPOTrainer


def _step_clock():
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.begins: list[float] = []
            self.ends: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begins.append(time.time())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.time())

    return StepClock()


def train(spec: dict) -> None:
    """The child process: train, save the final model, write the figures."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    rows = read_jsonl(Path(spec["train_path"]))
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    clock = _step_clock()
    trainer = _timed_trainer_class()(
        model=spec["model_dir"], reward_funcs=exact_match_reward, args=GRPOConfig(**spec["kwargs"]),
        train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(spec["model_dir"]), callbacks=[clock])
    trainer.train()
    trainer.save_model(spec["final_dir"])
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    phases = {name: [per_step[s] for s in sorted(per_step)] for name, per_step in trainer.phase_s.items()}
    Path(spec["result_path"]).write_text(json.dumps({
        "begins": clock.begins, "ends": clock.ends, "phases": phases, "completion_lengths": lengths,
        "threads": __import__("torch").get_num_threads()}))


def run_trl(kwargs: dict, model_dir: Path, train_path: Path, rep_dir: Path, timeout_s: float = 7200) -> RunFigures:
    """One TRL training in a fresh process; its figures. Start-up: launch to the first step's begin."""
    rep_dir.mkdir(parents=True, exist_ok=True)
    spec = {"model_dir": str(model_dir), "train_path": str(train_path), "kwargs": kwargs,
            "final_dir": str(rep_dir / "final"), "result_path": str(rep_dir / "trl_result.json")}
    (rep_dir / "trl_spec.json").write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launched = time.time()
    with open(rep_dir / "trl.log", "w") as log:
        done = subprocess.run([sys.executable, __file__, str(rep_dir / "trl_spec.json")], check=False, cwd=rep_dir,
                              env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"TRL run failed ({done.returncode}); end of {rep_dir / 'trl.log'}:\n"
                           + (rep_dir / "trl.log").read_text()[-3000:])
    result = json.loads((rep_dir / "trl_result.json").read_text())
    begins, ends = result["begins"], result["ends"]
    steps = [ends[0] - begins[0]] + [b - a for a, b in itertools.pairwise(ends)]
    phases = {name: median(values[1:] or values) for name, values in result["phases"].items()}
    if "prepare" in phases:
        phases["train"] = median(steps[1:] or steps) - phases["prepare"]  # the rest of the step: loss, backward, step
    lengths = result["completion_lengths"]
    return RunFigures("trl", steps, begins[0] - launched, sum(lengths) / len(lengths) if lengths else float("nan"),
                      final_dir=rep_dir / "final", phases=phases, extra={"threads": result["threads"]})


if __name__ == "__main__":
    train(json.loads(Path(sys.argv[1]).read_text()))
