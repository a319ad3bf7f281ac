"""The trainer's checks around preference training: pair layout, reward model vs loss, and
the classifier config a reward model is loaded with and exported under."""

import pytest
import torch
from transformers import AutoConfig

from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.config import ModelHead
from trainer_svc.engine import TrainerEngine
from trainer_svc.hf import classifier_config
from trainer_svc.pairs import validate_pairs
from trainer_svc.types import BradleyTerryLossConfig, DpoLossConfig, NllLossConfig, Sample

PAIR = [Sample((1, 5, 6), 1), Sample((1, 7), 1)]


def test_whole_pairs_pass():
    validate_pairs(PAIR * 4, global_batch_size=8, micro_batch_size=2, world_size=2)


@pytest.mark.parametrize("samples, gbs, mbs, message", [
    (PAIR + PAIR[:1], 3, 2, "odd"),
    (PAIR * 3, 6, 2, "multiple of 2 x the 2 trainer ranks"),
    (PAIR * 2, 4, 3, "must be even"),
    ([PAIR[0], Sample((1, 7), 1, loss_mask=(0.0,))], 4, 2, "sample 1"),
])
def test_split_pairs_are_refused(samples, gbs, mbs, message):
    with pytest.raises(ValueError, match=message):
        validate_pairs(samples, gbs, mbs, world_size=2)


class _Backend:
    rank, world_size, vocab_size = 0, 1, 16
    device = torch.device("cpu")


def _engine(reward_model: bool) -> TrainerEngine:
    return TrainerEngine(_Backend(), lockstep=None, model_name="m", plan=None, sender=None, fingerprint="",
                         log=None, head=ModelHead.SEQUENCE_SCORE if reward_model else ModelHead.LM)


@pytest.mark.parametrize("reward_model, loss", [(True, DpoLossConfig()), (True, NllLossConfig()),
                                                (False, BradleyTerryLossConfig())])
def test_reward_models_train_with_bradley_terry_only(reward_model, loss):
    with pytest.raises(ValueError, match="a reward model trains only with BradleyTerryLossConfig"):
        _engine(reward_model).train_step(PAIR, loss, global_batch_size=2, micro_batch_size=2)


def test_a_reward_model_has_no_token_logprobs():
    with pytest.raises(ValueError, match="reward model"):
        _engine(True).logprobs(PAIR, "current", 2)


def test_classifier_config_of_a_causal_lm(tmp_path):
    model_dir = ensure_tiny_model(tmp_path)
    config = classifier_config(model_dir)
    assert config.num_labels == 1 and config.architectures == ["LlamaForSequenceClassification"]
    assert config.pad_token_id == AutoConfig.from_pretrained(model_dir).pad_token_id


def test_classifier_config_falls_back_to_eos_for_padding(tmp_path):
    source = AutoConfig.from_pretrained(ensure_tiny_model(tmp_path))
    source.pad_token_id = None
    source.save_pretrained(tmp_path / "nopad")
    assert classifier_config(tmp_path / "nopad").pad_token_id == source.eos_token_id
