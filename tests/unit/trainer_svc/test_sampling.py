"""The sampler and decode loop of the generation the trainer serves itself: greedy is argmax,
top-k / top-p keep the right tokens, logprobs are untempered, seeded samples reproduce
whatever the batching, EOS stops a completion (kept, with its logprob), max_tokens ends it,
and an abort stops the decode."""

import math

import pytest
import torch
import torch.distributed as dist

from tandem.generation.types import SamplingConfig
from trainer_svc.decode import Decoder, DecodeRequest, DecodeSink
from trainer_svc.sampling import filter_logits, row_generator, sample_tokens


def _gens(count: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(count)]


def test_greedy_is_argmax_with_the_raw_logprob():
    logits = torch.randn(5, 11)
    tokens, logprobs = sample_tokens(logits, 0.0, -1, 1.0, _gens(5))
    assert tokens == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).max(-1).values
    assert logprobs == pytest.approx(expected.tolist(), abs=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))

    def kept(top_p: float) -> set[int]:
        return set(torch.isfinite(filter_logits(logits, -1, top_p))[0].nonzero().flatten().tolist())

    assert kept(0.4) == {1}  # the most likely token always stays
    assert kept(0.7) == {1, 3}
    assert kept(0.9) == {1, 3, 2}
    assert kept(1.0) == {0, 1, 2, 3}


def test_top_k_then_top_p():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    assert torch.isfinite(filter_logits(logits, 2, 1.0))[0].tolist() == [False, True, False, True]
    assert torch.isfinite(filter_logits(logits, 3, 0.6))[0].tolist() == [False, True, False, True]
    assert torch.isfinite(filter_logits(logits, 0, 1.0)).all()  # 0 and -1 disable top-k


def test_sampled_tokens_stay_in_the_kept_set_and_logprobs_are_untempered():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]])).repeat(200, 1)
    tokens, logprobs = sample_tokens(logits, 0.7, -1, 0.7, _gens(200))
    assert set(tokens) == {1, 3}
    raw = torch.log_softmax(logits[0], -1)
    assert all(math.isclose(lp, float(raw[t]), abs_tol=1e-6) for t, lp in zip(tokens, logprobs))


def test_seeded_rows_reproduce_whatever_the_batch():
    logits = torch.randn(6, 50)
    together, _ = sample_tokens(logits, 1.0, -1, 1.0, _gens(6, seed=7))
    alone = [sample_tokens(logits[i:i + 1], 1.0, -1, 1.0, [torch.Generator().manual_seed(7 + i)])[0][0]
             for i in range(6)]
    assert together == alone
    other, _ = sample_tokens(logits, 1.0, -1, 1.0, _gens(6, seed=1000))
    assert other != together
    fallback = torch.Generator().manual_seed(0)
    assert row_generator(5, fallback).initial_seed() == 5
    assert row_generator(None, fallback).initial_seed() != row_generator(None, fallback).initial_seed()


# --------------------------------------------------------------------------- decode loop

VOCAB, EOS = 8, 7


class _CountingModel:
    """Next-token logits that favour (last token + 1) and EOS once a row is 6 tokens long."""

    def last_token_logits(self, rows):
        logits = torch.full((len(rows), VOCAB), -4.0)
        for i, row in enumerate(rows):
            logits[i, EOS if len(row) >= 6 else (row[-1] + 1) % EOS] = 4.0
        return logits


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("dist") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _decode(prompts, sampling, *, max_num_seqs=64, abort_after=None):
    out = []
    sink = DecodeSink(out.append, lambda: abort_after is not None and len(out) >= abort_after)
    decoder = Decoder(_CountingModel(), eos_ids=frozenset({EOS}), max_num_seqs=max_num_seqs, group=None, rank=0,
                      seed=0)
    finished = decoder.run(DecodeRequest(tuple(map(tuple, prompts)), sampling, weight_version=3), sink)
    return finished, sorted(out, key=lambda c: (c.prompt_index, c.sample_index))


def test_greedy_decode_stops_at_eos_or_max_tokens(world_of_one):
    finished, out = _decode([[0, 1, 2], [0]], SamplingConfig(n=1, temperature=0.0, max_tokens=4))
    assert finished
    assert out[0].token_ids == (3, 4, 5, EOS) and out[0].finish_reason == "stop"  # EOS is kept
    assert out[1].token_ids == (1, 2, 3, 4) and out[1].finish_reason == "length"
    assert all(len(c.logprobs) == len(c.token_ids) and c.weight_version == 3 for c in out)
    assert out[0].logprobs[-1] == pytest.approx(float(torch.log_softmax(torch.tensor([-4.0] * 7 + [4.0]), -1)[EOS]))


def test_seeded_decode_is_the_same_in_chunks(world_of_one):
    sampling = SamplingConfig(n=3, temperature=5.0, max_tokens=5, seed=11)
    prompts = [[0, 1], [2], [3, 4, 5]]
    _, whole = _decode(prompts, sampling)
    _, chunked = _decode(prompts, sampling, max_num_seqs=2)
    assert [c.token_ids for c in whole] == [c.token_ids for c in chunked]
    assert len({c.token_ids for c in whole}) > 3  # temperature 5: the samples differ


def test_abort_stops_the_decode(world_of_one):
    finished, out = _decode([[0], [0, 1, 2, 3, 4]], SamplingConfig(n=1, temperature=0.0, max_tokens=6), abort_after=1)
    assert not finished and len(out) == 1 and out[0].prompt_index == 1
