"""PPO's advantages from a critic's values: generalized advantage estimation (GAE), pure
functions over per-token tensors of shape (B, L): B completions, L the longest completion's
tokens, column t the completion's token t (the layout of a Sample's per-token lists, right-padded).

For completion tokens t (the policy's actions) with values V_t (the critic's value of the state
the token is sampled from: the prompt and tokens 0..t-1) and rewards r_t:

    delta_t   = r_t + gamma * V_next(t) - V_t
    A_t       = delta_t + gamma * lam * A_next(t)
    returns_t = A_t + V_t                      (the critic's target)

where next(t) is the next masked-in token after t (tokens with mask 0, a tool's output in a
multi-turn episode or padding, are skipped: they are no action of the policy), and after the
last masked-in token V and A are 0 (the episode ended). Masked-out tokens get advantage 0 and
return 0. The task reward is given at the last masked-in token (`terminal_rewards`).
"""

from __future__ import annotations

import torch

_EPS = 1e-8


def terminal_rewards(rewards_B: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
    """(B, L): each completion's reward on its last masked-in token, 0 elsewhere (and on a row
    with no masked-in token)."""
    if rewards_B.dim() != 1 or mask_BL.dim() != 2 or rewards_B.shape[0] != mask_BL.shape[0]:
        raise ValueError(f"rewards (B,) and mask (B, L) must agree, got {tuple(rewards_B.shape)} "
                         f"and {tuple(mask_BL.shape)}")
    inside = mask_BL > 0
    columns = torch.arange(mask_BL.shape[1], device=mask_BL.device).expand_as(mask_BL)
    last = torch.where(inside, columns, -1).amax(dim=1)
    out = torch.zeros(mask_BL.shape, dtype=rewards_B.dtype, device=mask_BL.device)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = rewards_B[rows]
    return out


def gae_advantages(rewards_BL: torch.Tensor, values_BL: torch.Tensor, mask_BL: torch.Tensor, *, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, L) in float64 math cast back to the rewards' dtype (see
    the module docstring). gamma and lam in [0, 1]."""
    if not (rewards_BL.shape == values_BL.shape == mask_BL.shape) or rewards_BL.dim() != 2:
        raise ValueError(f"rewards, values and mask must all be (B, L), got {tuple(rewards_BL.shape)}, "
                         f"{tuple(values_BL.shape)}, {tuple(mask_BL.shape)}")
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    rewards, values = rewards_BL.to(torch.float64), values_BL.to(torch.float64)
    inside = mask_BL > 0
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=torch.float64, device=rewards.device)
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        here = inside[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(here, advantage, 0.0)
        next_value = torch.where(here, values[:, t], next_value)
        next_advantage = torch.where(here, advantage, next_advantage)
    returns = torch.where(inside, advantages + values, 0.0)
    return advantages.to(rewards_BL.dtype), returns.to(rewards_BL.dtype)


def whiten(advantages_BL: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
    """(A - mean) / std over the masked-in tokens of the whole batch (biased variance), 0 where
    the mask is 0; a batch whose advantages are all equal is only centred."""
    inside = mask_BL > 0
    count = inside.sum()
    if count == 0:
        return torch.zeros_like(advantages_BL)
    values = advantages_BL.to(torch.float64)
    mean = values[inside].mean()
    std = (values[inside] - mean).square().mean().sqrt()
    centred = values - mean
    scaled = centred / (std + _EPS) if std > 0 else centred
    return torch.where(inside, scaled, 0.0).to(advantages_BL.dtype)


def explained_variance(values_BL: torch.Tensor, returns_BL: torch.Tensor, mask_BL: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked-in tokens: 1 for a critic that
    predicts the returns, 0 for one no better than their mean, negative when worse; NaN-free
    (0.0) when the returns do not vary."""
    inside = mask_BL > 0
    if inside.sum() == 0:
        return 0.0
    target, predicted = returns_BL[inside].to(torch.float64), values_BL[inside].to(torch.float64)
    variance = target.var(unbiased=False)
    if variance == 0:
        return 0.0
    return float(1 - (target - predicted).var(unbiased=False) / variance)


def padded(rows: list[list[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad lists of per-token values into (B, L) with zeros."""
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.as_tensor(row, dtype=dtype)
    return out
