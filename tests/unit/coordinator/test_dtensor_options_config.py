"""policy.dtensor_cfg.* and policy.sequence_packing.* reach the trainer's settings (NeMo-RL key names)."""

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.launch import trainer_settings


def test_sequence_packing_keys_reach_the_trainer():
    cfg = load_config(overrides=["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=512",
                                 "policy.sequence_packing.algorithm=concatenative"])
    packing = trainer_settings(cfg, "model").sequence_packing
    assert (packing.enabled, packing.train_mb_tokens, packing.logprob_mb_tokens, packing.algorithm) == (
        True, 512, 2048, "concatenative")
    with pytest.raises(ConfigError, match="policy.sequence_packing.algorithm"):
        load_config(overrides=["policy.sequence_packing.algorithm=best_fit"])
