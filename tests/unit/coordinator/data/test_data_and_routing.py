import json

import pytest

from coordinator.config.data import DataConfig
from coordinator.data.examples import Example, PromptCursor, read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.tiny_model import build_char_tokenizer
from coordinator.loop.rollout import split_by_capacity
from coordinator.loop.scoring import RewardRouter
from reward_svc.types import ScoreItem, ScoreResult


def _examples(n):
    return [Example(str(i), str(i), "t", (i,)) for i in range(n)]


def test_cursor_is_reproducible_and_resumable():
    a, b = PromptCursor(_examples(10), seed=3), PromptCursor(_examples(10), seed=3)
    first = a.next_batch(4)
    assert first == b.next_batch(4)
    state = a.state()
    ahead = a.next_batch(9)  # crosses an epoch boundary
    c = PromptCursor(_examples(10), seed=3)
    c.load_state(state)
    assert c.next_batch(9) == ahead


def test_cursor_epoch_covers_every_example_once():
    cursor = PromptCursor(_examples(7), seed=0)
    assert sorted(e.prompt for e in cursor.next_batch(7)) == sorted(str(i) for i in range(7))


def test_read_examples_names_the_line_that_is_not_json(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"d.jsonl:2: not a JSON object"):
        read_examples(path, DataConfig(), Tokens("test", build_char_tokenizer()))


def test_split_by_capacity_is_proportional_and_complete():
    shares = split_by_capacity(16, [256, 256])
    assert [len(s) for s in shares] == [8, 8]
    shares = split_by_capacity(10, [1, 3])
    assert sum(len(s) for s in shares) == 10 and len(shares[1]) > len(shares[0])
    assert [i for s in split_by_capacity(5, [2, 2, 2]) for i in s] == list(range(5))


class _Fixed:
    def __init__(self, reward):
        self.reward, self.calls = reward, []

    def score(self, items):
        self.calls.append([i.task for i in items])
        return [ScoreResult(self.reward, self.reward > 0) for _ in items]


def test_router_splits_mixed_batches_and_merges_in_order():
    a, b = _Fixed(1.0), _Fixed(0.0)
    router = RewardRouter({"a": a, "b": b})
    items = [ScoreItem(t, "", "", "") for t in "abba"]
    assert [r.reward for r in router.score(items)] == [1.0, 0.0, 0.0, 1.0]
    assert a.calls == [["a", "a"]] and b.calls == [["b", "b"]]
    with pytest.raises(ValueError, match=r"no reward service serves tasks \['c'\]"):
        router.score([ScoreItem("c", "", "", "")])
