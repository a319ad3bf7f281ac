"""The flags of benchmarks/calibrate_embedded.py: model size, SFT and GRPO recipes, and the
variants tried (optimizer, loss aggregation, normalisation, minibatches, annealing)."""

from __future__ import annotations

import argparse

from coordinator.embedded.tiny_model import DEFAULT_SPEC


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Calibrate the embedded default job (benchmarks/calibrate_embedded.py)")
    p.add_argument("--hidden", type=int, default=DEFAULT_SPEC.hidden_size)
    p.add_argument("--inter", type=int, default=DEFAULT_SPEC.intermediate_size)
    p.add_argument("--layers", type=int, default=4, help="4 (~1M params) gains more under GRPO than the 2-layer default spec")
    p.add_argument("--heads", type=int, default=DEFAULT_SPEC.num_heads)
    p.add_argument("--kv-heads", type=int, default=DEFAULT_SPEC.num_kv_heads)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--num-val", type=int, default=500)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--sft-bs", type=int, default=16)
    p.add_argument("--sft-steps", type=int, default=2000)
    p.add_argument("--sft-beta2", type=float, default=0.98)
    p.add_argument("--sft-grad-clip", type=float, default=0.0, help="SFT grad-norm clip (0: off)")
    p.add_argument("--sft-warmup", type=int, default=20)
    p.add_argument("--sft-cosine", type=int, default=0, help="cosine-decay the SFT lr over --sft-steps")
    p.add_argument("--sft-min-lr-frac", type=float, default=0.1)
    p.add_argument("--sft-eval-every", type=int, default=50)
    p.add_argument("--sft-target", type=float, default=0.45, help="stop SFT once val acc >= this (0: off)")
    p.add_argument("--sft-anneal-at", type=float, default=0.0,
                   help="once val acc >= this, cosine-decay the lr to 0 over --sft-anneal-steps and stop (0: off)")
    p.add_argument("--sft-anneal-steps", type=int, default=100)
    p.add_argument("--save-sft", default="", help="save the SFT state_dict here (to reuse across GRPO runs)")
    p.add_argument("--load-sft", default="", help="skip SFT and load this state_dict")
    p.add_argument("--grpo-lr", type=float, default=2e-4, help="the embedded demo's (policy.optimizer.kwargs.lr)")
    p.add_argument("--grpo-steps", type=int, default=60)
    p.add_argument("--grpo-eval-every", type=int, default=10)
    p.add_argument("--grpo-epochs", type=int, default=1, help="optimizer steps per sampled batch")
    p.add_argument("--grpo-warmup", type=int, default=0, help="linear lr warmup steps (0: none)")
    p.add_argument("--grpo-keep-opt", type=int, default=1,
                   help="1: continue the SFT AdamW state (moments, step count) in GRPO instead of a fresh one")
    p.add_argument("--grpo-optim", choices=["adamw", "sgd"], default="adamw",
                   help="sgd uses --grpo-beta1 as momentum")
    p.add_argument("--grpo-beta1", type=float, default=0.9)
    p.add_argument("--grpo-beta2", type=float, default=0.999)
    p.add_argument("--grpo-eps", type=float, default=1e-8, help="Adam epsilon")
    p.add_argument("--grpo-wd", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--grpo-seed", type=int, default=-1, help="seed of GRPO prompt order and sampling (-1: --seed)")
    p.add_argument("--minibatches", type=int, default=1, help="optimizer steps per epoch over the sampled batch")
    p.add_argument("--loss-agg", choices=["token", "seq", "const"], default="token")
    p.add_argument("--baseline", choices=["loo", "mean"], default="loo")
    p.add_argument("--neg-adv-scale", type=float, default=1.0,
                   help="multiply negative advantages by this (diagnostic; 1: plain GRPO, 0: positive only)")
    p.add_argument("--std-norm", type=int, default=1, help="divide advantages by the group reward std")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--grad-clip", type=float, default=0.0, help="GRPO grad-norm clip (0: off)")
    p.add_argument("--max-new", type=int, default=4)
    return p.parse_args(argv)
