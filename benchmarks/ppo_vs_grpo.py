"""PPO with a critic against GRPO at equal steps on the embedded task (issue 31 item 2), every run
through the real services as `tandem run` runs it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppo_vs_grpo.py --out /tmp/ppo-bench [--steps 20]

1. student: the demo's SFT warm start alone (examples/configs/grpo.yaml, grpo.max_num_steps=0),
   exported; its held-out accuracy is the arms' starting point (cached in --out).
2. the arms, each from the student for --steps steps with grpo.yaml's sizes and the policy's
   optimizer (16 prompts x 8 samples, one optimizer step of 128 samples at lr 2e-4), the same
   prompts and sampling seed: GRPO (grpo.yaml: leave-one-out group baseline, std-normalised) and
   PPO (examples/configs/ppo.yaml: a critic service from the student's checkpoint with a fresh
   value head, GAE with gamma 1 and lam 0.95, whitened advantages).
Held-out accuracy (grpo.max_val_samples problems, greedy) every --val-period steps; the PPO arm
also logs the critic's explained variance and value loss per step. --trainer-ranks sets both
arms' trainer ranks (and the student's). Prints one JSON line with both curves.
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


def _steps(summary: dict, key: str) -> list[float]:
    return [round(float(r[key]), 4) for r in summary["metrics"] if r["phase"] == "grpo" and key in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--val-period", type=int, default=5)
    parser.add_argument("--val-samples", type=int, default=500)
    parser.add_argument("--trainer-ranks", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42, help="grpo.seed of the two arms (prompt order, sampling)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    common = {"grpo.max_val_samples": args.val_samples, "cluster.trainer_ranks": args.trainer_ranks}
    student = train(RECIPES / "grpo.yaml", args.out, "student", **{"grpo.max_num_steps": 0}, **common)
    arm = {"policy.model_name": student["hf"], "sft.max_num_steps": 0, "policy.max_total_sequence_length": 64,
           "policy.generation.max_new_tokens": 4, "grpo.max_num_steps": args.steps,
           "grpo.val_period": args.val_period, "grpo.seed": args.seed, **common}
    suffix = f"{args.steps}-seed{args.seed}"
    grpo = train(RECIPES / "grpo.yaml", args.out, f"grpo-{suffix}", **arm)
    recipe = yaml.safe_load((RECIPES / "ppo.yaml").read_text())
    grpo_recipe = yaml.safe_load((RECIPES / "grpo.yaml").read_text())
    recipe["policy"] = grpo_recipe["policy"]  # the same sizes and optimizer
    recipe["grpo"] = {k: v for k, v in grpo_recipe["grpo"].items() if k not in ("normalize_rewards",
                                                                                "use_leave_one_out_baseline",
                                                                                "adv_estimator")}
    ppo = train(recipe, args.out, f"ppo-{suffix}", **arm)
    result = {"student_accuracy": student["accuracy_after"], "steps": args.steps, "seed": args.seed,
              "grpo": curve(grpo), "ppo": curve(ppo),
              "grpo_reward_mean": _steps(grpo, "reward_mean"), "ppo_reward_mean": _steps(ppo, "reward_mean"),
              "ppo_explained_variance": _steps(ppo, "explained_variance"),
              "ppo_critic_value_loss": _steps(ppo, "critic_value_loss"),
              "wall_s": {"grpo": round(grpo["bench_wall_s"], 1), "ppo": round(ppo["bench_wall_s"], 1)}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
