"""Per-token estimators of KL(policy || reference) from sampled-token logprobs (Schulman's
k1/k2/k3, http://joschu.net/blog/kl-approx.html).

Shared because two services need the same numbers: the trainer's loss (KL penalty in the
loss) and the coordinator (KL penalty subtracted from the rewards, `loss_fn.use_kl_in_reward`).
Tensors of any matching shape; the estimate is element-wise. With log_r = reference - policy:
    k1 = -log_r          k2 = log_r^2 / 2          k3 = exp(log_r) - 1 - log_r
log_r is clamped to [-input_clamp, input_clamp] first and the estimate to
[-output_clamp, output_clamp] after (None: no clamp), as NeMo-RL's `calculate_kl` does.
"""

from __future__ import annotations

from typing import Literal

import torch

KlType = Literal["k1", "k2", "k3"]


def kl_estimate(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, kl_type: KlType = "k3", *,
                input_clamp: float | None = None, output_clamp: float | None = None) -> torch.Tensor:
    """Element-wise KL estimate of the policy that sampled the tokens against the reference."""
    log_r = reference_logprobs - logprobs
    if input_clamp is not None:
        log_r = log_r.clamp(-input_clamp, input_clamp)
    match kl_type:
        case "k1":
            kl = -log_r
        case "k2":
            kl = log_r.square() / 2
        case "k3":
            kl = torch.exp(log_r) - 1 - log_r
        case _:
            raise ValueError(f"unknown KL estimator {kl_type!r}: use k1, k2 or k3")
    if output_clamp is not None:
        kl = kl.clamp(-output_clamp, output_clamp)
    return kl
