"""Batch layout: right padding, token alignment, rank shards and input validation."""

import pytest
import torch

from trainer_svc.batching import (
    collate,
    completion_logprobs,
    count_loss_tokens,
    rank_shard,
    token_logprobs,
    validate_samples,
    validate_train_layout,
)
from trainer_svc.types import Sample


def test_collate_right_pads_and_aligns_completion_tokens():
    samples = [Sample((1, 5, 6, 7), 2, loss_mask=(1, 0), generation_logprobs=(-0.5, -0.25), advantage=2.0),
               Sample((1, 9, 8), 1)]
    batch = collate(samples, pad_id=0, device=torch.device("cpu"))
    assert batch.input_ids.tolist() == [[1, 5, 6, 7], [1, 9, 8, 0]]
    # column j holds token j+1: sample 0's completion tokens 6, 7 sit in columns 1, 2
    assert batch.mask.tolist() == [[0, 1, 0], [1, 1, 0]]
    assert batch.generation_logprobs.tolist() == [[0, -0.5, -0.25], [0, 0, 0]]
    assert batch.advantages.tolist() == [[0, 2, 2], [0, 0, 0]]
    logits = torch.randn(2, 4, 10)
    rows = completion_logprobs(token_logprobs(logits, batch.input_ids), batch)
    expected = torch.log_softmax(logits[0, 2], -1)[7].item()  # log p(token 3 = 7 | tokens 0..2)
    assert [len(r) for r in rows] == [2, 2] and rows[0][1] == pytest.approx(expected)


def test_rank_shards_cover_the_batch_in_order():
    samples = list(range(5))
    assert [rank_shard(samples, r, 2) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert count_loss_tokens([Sample((1, 2, 3), 1, loss_mask=(0, 1)), Sample((1, 2), 1)]) == 2


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="no completion"):
        validate_samples([Sample((1, 2), 2)], 10, need_generation_logprobs=False)
    with pytest.raises(ValueError, match="token ids"):
        validate_samples([Sample((1, 20), 1)], 10, need_generation_logprobs=False)
    with pytest.raises(ValueError, match="generation_logprobs"):
        validate_samples([Sample((1, 2), 1)], 10, need_generation_logprobs=True)
    with pytest.raises(ValueError, match="loss_mask"):
        validate_samples([Sample((1, 2), 1, loss_mask=(1, 1))], 10, need_generation_logprobs=False)
    with pytest.raises(ValueError, match="optimizer steps"):
        validate_train_layout(6, 4, 1, 2)
    with pytest.raises(ValueError, match="multiple"):
        validate_train_layout(6, 3, 1, 2)
    validate_train_layout(8, 4, 3, 2)
