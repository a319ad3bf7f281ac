"""The reward-model environment through real reward_svc processes on 127.0.0.1: the embedded
tiny reward model, trained here for a few Bradley-Terry steps on toy preferences, scores the
preferred answer above the rejected one on held-out pairs, which the untrained model does not.

Toy preferences: prompt "a+b=", chosen = the sum, rejected = the sum plus 10..40 (a wrong
answer far off, which a 0.1 M-parameter model learns to spot in a few dozen steps; near misses
take far longer). Training and held-out prompts are disjoint.
"""

import json
import random

import pytest
import torch
import torch.nn.functional as F

from coordinator.embedded.reward_model import build_tiny_reward_model
from reward_svc.client import RewardClient
from reward_svc.types import ScoreItem
from tests import procs

pytestmark = pytest.mark.integration
STEPS = 40


def _pairs(operands, seed):
    rng = random.Random(seed)
    return [(f"{a}+{b}=", str(a + b), str(a + b + rng.randint(10, 40))) for a, b in operands]


def _split():
    operands = [(a, b) for a in range(10) for b in range(10)]
    random.Random(0).shuffle(operands)
    return _pairs(operands[:80], 1), _pairs(operands[80:], 2)


def _train(model_dir, out_dir, train_pairs):
    """Bradley-Terry: minimise -log sigmoid(r(chosen) - r(rejected)) over random minibatches."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(3)

    def scores(texts):
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        return model(**batch).logits[:, 0]

    losses = []
    for _ in range(STEPS):
        batch = [rng.choice(train_pairs) for _ in range(32)]
        loss = -F.logsigmoid(scores([p + c for p, c, _ in batch]) - scores([p + r for p, _, r in batch])).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return losses


def _serve_and_score(workdir, name, model_dir, pairs):
    """Start `python -m reward_svc` on model_dir, score chosen and rejected answers over gRPC."""
    settings = workdir / f"{name}.json"
    settings.write_text(json.dumps({"tasks": {"prefs": "reward_model"},
                                    "reward_model": {"model_name": str(model_dir), "batch_size": 8}}))
    service = procs.start(procs.python_module("reward_svc", "--settings", str(settings)), workdir, name)
    client = RewardClient(service.address, procs.TOKEN)
    try:
        assert client.info().scorers == {"prefs": "reward_model"}
        items = [ScoreItem("prefs", p, answer, "") for p, c, r in pairs for answer in (c, r)]
        results = client.score(items)
    finally:
        client.close()
        assert service.stop() == 0, service.log()[-2000:]
    assert all(res.correct == (res.reward > 0) for res in results)
    rewards = [res.reward for res in results]
    return rewards[0::2], rewards[1::2]


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rm")
    train_pairs, held_out = _split()
    untrained_dir = build_tiny_reward_model(workdir / "untrained")
    losses = _train(untrained_dir, workdir / "trained", train_pairs)
    before = _serve_and_score(workdir, "reward-untrained", untrained_dir, held_out)
    after = _serve_and_score(workdir, "reward-trained", workdir / "trained", held_out)
    return losses, before, after


def test_bradley_terry_steps_reduce_the_loss(scored):
    losses, _, _ = scored
    assert sum(losses[-5:]) / 5 < 0.3 < losses[0]


def test_preferred_answers_score_higher_after_training(scored):
    _, _, (chosen, rejected) = scored
    wins = sum(c > r for c, r in zip(chosen, rejected))
    assert wins >= 0.9 * len(chosen), (chosen, rejected)


def test_margin_grows_over_the_untrained_model(scored):
    _, (chosen0, rejected0), (chosen1, rejected1) = scored
    margin_before = sum(c - r for c, r in zip(chosen0, rejected0)) / len(chosen0)
    margin_after = sum(c - r for c, r in zip(chosen1, rejected1)) / len(chosen1)
    wins_before = sum(c > r for c, r in zip(chosen0, rejected0))
    assert wins_before < 0.9 * len(chosen0)  # the untrained model cannot tell them apart
    assert margin_after > margin_before + 1.0, (margin_before, margin_after)
