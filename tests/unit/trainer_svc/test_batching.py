"""Batch layout: right padding, token alignment, rank shards and input validation."""

import pytest
import torch

from trainer_svc.batching import (
    collate,
    completion_logprobs,
    count_loss_tokens,
    pack,
    pack_bins,
    rank_micro_batches,
    rank_shard,
    token_logprobs,
    unpack_logprobs,
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


def test_pack_bins_respect_the_token_budget():
    lengths = [5, 9, 3, 7, 2, 12]
    ffd = pack_bins(lengths, 12, "first_fit_decreasing")
    assert sorted(i for b in ffd for i in b) == list(range(6))
    assert all(sum(lengths[i] for i in b) <= 12 for b in ffd) and len(ffd) == 4  # 38 tokens need >= 4 bins
    assert pack_bins(lengths, 12, "concatenative") == [[0], [1, 2], [3, 4], [5]]
    assert pack_bins([20, 3], 8, "first_fit_decreasing") == [[0], [1]]  # too long: a bin alone
    with pytest.raises(ValueError, match="algorithm"):
        pack_bins(lengths, 12, "best_fit")


def test_packed_row_gives_the_padded_logprobs_of_a_real_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    samples = [Sample((1, 5, 6, 7, 9), 2, loss_mask=(1, 0, 1)), Sample((1, 9, 8), 1), Sample((1, 4, 4, 3), 3)]
    batch = pack(samples, pad_id=0, device=torch.device("cpu"))
    row = batch.packed
    assert row.input_ids.tolist() == [[1, 5, 6, 7, 9, 1, 9, 8, 1, 4, 4, 3]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]]
    # sample 0 masks its second completion token; the columns that cross a boundary (4, 7) are 0
    assert row.mask.tolist() == [[0, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1]]
    with torch.no_grad():  # use_cache=False: with a KV cache HF does not read packing from the position ids
        padded = token_logprobs(model(input_ids=batch.input_ids, use_cache=False).logits, batch.input_ids)
        logits = model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False).logits
        packed = unpack_logprobs(token_logprobs(logits, row.input_ids), row)
    assert packed.shape == padded.shape
    assert torch.allclose(packed * batch.mask, padded * batch.mask, atol=1e-6)
    for got, want in zip(completion_logprobs(packed, batch), completion_logprobs(padded, batch), strict=True):
        assert got == pytest.approx(want, abs=1e-6)


def test_every_rank_runs_as_many_micro_batches():
    samples = [Sample(tuple(range(1, n + 1)), 1) for n in (10, 10, 10, 2, 2, 2)]
    split = lambda shard: pack_bins([len(s.token_ids) for s in shard], 10, "first_fit_decreasing")  # noqa: E731
    shard0, groups0 = rank_micro_batches(samples, 0, 2, split)
    shard1, groups1 = rank_micro_batches(samples, 1, 2, split)
    assert groups0 == [[0], [1], [2]] and groups1 == [[0, 1, 2], [], []]
    assert list(shard1) == samples[3:]
