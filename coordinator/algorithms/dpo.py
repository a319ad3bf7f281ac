"""DPO (https://arxiv.org/abs/2305.18290, NeMo-RL's `dpo.*` keys): each step sends
policy.train_global_batch_size preference pairs to the trainer, which scores them under the
frozen reference and takes one optimizer step on the DPO loss (`trainer_svc.losses.preference`).
No generator is involved. Validation scores held-out pairs under the current and reference
policy (ComputeLogprobs) and reports DPO's reward accuracy and margin on them."""

from __future__ import annotations

from coordinator.algorithms.preference import PreferenceContext, policy_samples
from coordinator.data.preference import PreferencePair


def dpo_step(ctx: PreferenceContext) -> dict[str, float]:
    samples = policy_samples(ctx.tokens, ctx.next_pairs())
    result = ctx.trainer.train_step(samples, ctx.cfg.dpo.trainer_loss(), **ctx.batch_sizes())
    return {**result.metrics, "num_pairs": len(samples) / 2.0}


class DpoValidator:
    """Held-out reward accuracy: r = sum over response tokens of (policy - reference) logprob
    (averaged with dpo.preference_average_log_probs); a pair counts when r_chosen > r_rejected.
    The reference logprobs never change, so they are computed once."""

    def __init__(self, ctx: PreferenceContext, pairs: list[PreferencePair]):
        self._ctx = ctx
        self._samples = policy_samples(ctx.tokens, pairs)
        self._micro = 2 * ctx.cfg.policy.logprob_batch_size
        self._reference = ctx.trainer.logprobs(self._samples, "reference", self._micro)

    def __call__(self) -> dict[str, float]:
        current = self._ctx.trainer.logprobs(self._samples, "current", self._micro)
        average = self._ctx.cfg.dpo.preference_average_log_probs
        rewards = [(sum(c) - sum(r)) / (len(c) if average else 1) for c, r in zip(current, self._reference)]
        margins = [rewards[i] - rewards[i + 1] for i in range(0, len(rewards), 2)]
        return {"accuracy": sum(m > 0 for m in margins) / len(margins),
                "reward_margin": sum(margins) / len(margins)}
