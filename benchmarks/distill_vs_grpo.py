"""On-policy distillation against GRPO at equal steps on the embedded task (issue 31 item 1),
every run through the real services as `tandem run` runs it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/distill_vs_grpo.py --out /tmp/distill-bench [--steps 20]

1. student: the demo's SFT warm start alone (examples/configs/grpo.yaml, grpo.max_num_steps=0),
   exported; its held-out accuracy is the arms' starting point.
2. teacher: GRPO from the student for --teacher-steps steps (the demo's GRPO), exported.
3. the arms, each from the student for --steps steps with grpo.yaml's sizes and optimizer
   (16 prompts x 8 samples, one optimizer step of 128 samples at lr 2e-4): GRPO, and
   distillation from the teacher (distillation.yaml's loss, kl_penalty_coef 1, no task reward).
Held-out accuracy (grpo.max_val_samples problems, greedy) every --val-period steps; the
distillation arm also logs its per-token reverse KL to the teacher. Steps 1-2 are cached in
--out (delete it to start over). Prints one JSON line per arm and a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an installed copy

from recipe_runs import RECIPES, curve, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--teacher-steps", type=int, default=60)
    parser.add_argument("--val-period", type=int, default=5)
    parser.add_argument("--val-samples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=42, help="grpo.seed of the two arms (prompt order, sampling)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    val = {"grpo.max_val_samples": args.val_samples}
    student = train(RECIPES / "grpo.yaml", args.out, "student", **{"grpo.max_num_steps": 0}, **val)
    same = {"policy.model_name": student["hf"], "sft.max_num_steps": 0, "policy.max_total_sequence_length": 64,
            "policy.generation.max_new_tokens": 4, **val}
    teacher = train(RECIPES / "grpo.yaml", args.out, "teacher", **same,
                     **{"grpo.max_num_steps": args.teacher_steps, "grpo.val_period": 0})
    arm = {**same, "grpo.max_num_steps": args.steps, "grpo.val_period": args.val_period, "grpo.seed": args.seed}
    suffix = f"{args.steps}" if args.seed == 42 else f"{args.steps}-seed{args.seed}"
    grpo = train(RECIPES / "grpo.yaml", args.out, f"grpo-{suffix}", **arm)
    recipe = yaml.safe_load((RECIPES / "distillation.yaml").read_text())
    recipe["distillation"]["teacher"]["model_name"] = teacher["hf"]
    grpo_recipe = yaml.safe_load((RECIPES / "grpo.yaml").read_text())
    recipe["grpo"], recipe["policy"] = grpo_recipe["grpo"], grpo_recipe["policy"]  # the same sizes and optimizer
    distill = train(recipe, args.out, f"distillation-{suffix}", **arm)
    kl = [round(r["teacher_reverse_kl"], 3) for r in distill["metrics"] if r["phase"] == "grpo"]
    result = {"student_accuracy": student["accuracy_after"], "teacher_accuracy": teacher["accuracy_after"],
              "steps": args.steps, "seed": args.seed, "grpo": curve(grpo), "distillation": curve(distill),
              "distillation_reverse_kl_first_last": [kl[0], kl[-1]] if kl else None,
              "wall_s": {"grpo": round(grpo["bench_wall_s"], 1), "distillation": round(distill["bench_wall_s"], 1)}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
