"""A PPO critic of its own (ppo.critic.model_name) checked against the policy before anything
starts: its files (model_files.py) and its tokenizer (the critic values the policy's token ids, so
both must map every token to the same id). Unset, the critic is the policy's own checkpoint."""

from __future__ import annotations

from coordinator.config import ExperimentConfig
from coordinator.preflight.model_files import check_model_dir
from coordinator.preflight.teacher import check_same_vocabulary

KEY = "ppo.critic.model_name"


def check_critic(cfg: ExperimentConfig, policy_dir: str | None) -> str:
    """ConfigError naming what to change; what was checked, in words. policy_dir: the policy's
    checkpoint (None: the embedded model, not built yet, whose tokenizer is built here)."""
    assert cfg.ppo is not None and cfg.ppo.critic is not None
    critic_dir = cfg.ppo.critic.model_name
    if critic_dir is None:
        return "critic: the policy's checkpoint with a fresh value head"
    check_model_dir(critic_dir, KEY)
    size = check_same_vocabulary(KEY, "critic", critic_dir, policy_dir,
                                 "critic values the policy's token ids, so both need one vocabulary: pick a critic of "
                                 "the policy's model family, or leave it unset (the policy's checkpoint)")
    return f"critic {critic_dir}: the policy's tokenizer ({size} tokens)"
