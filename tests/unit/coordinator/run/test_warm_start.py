"""The SFT warm start's held-out checks: every sft.val_period steps, and every
sft.near_target_val_period steps once the accuracy has reached half of sft.stop_at_accuracy."""

from coordinator.config import load_config
from coordinator.run.grpo_run import _sft_chunk


def test_checks_come_closer_once_the_accuracy_nears_the_target():
    sft = load_config(overrides=["sft.val_period=50", "sft.near_target_val_period=10",
                                 "sft.stop_at_accuracy=0.4"]).sft
    assert [_sft_chunk(sft, accuracy) for accuracy in (None, 0.0, 0.19, 0.2, 0.39)] == [50, 50, 50, 10, 10]


def test_without_a_target_or_a_near_period_every_check_is_val_period_apart():
    no_target = load_config(overrides=["sft.near_target_val_period=10", "sft.stop_at_accuracy=null"]).sft
    no_near = load_config(overrides=["sft.near_target_val_period=null", "sft.stop_at_accuracy=0.4"]).sft
    assert _sft_chunk(no_target, 0.3) == no_target.val_period and _sft_chunk(no_near, 0.3) == no_near.val_period

