"""The reward-model scorer in process: batched, right-padded, length-sorted scoring reads the
same scalar as an unpadded one-sequence HF forward; long inputs keep their end; squash and
`correct`; a reward_model task without a model is a config error; the engine routes
reward-model items of a mixed call to the model and keeps the order."""

import asyncio
import math

import pytest
import structlog
import torch
from pydantic import ValidationError

from coordinator.embedded.reward_model import ensure_tiny_reward_model
from reward_svc.config import RewardModelSettings, RewardSettings
from reward_svc.engine import RewardEngine
from reward_svc.envs.reward_model import RewardModel
from reward_svc.types import ScoreItem

TEXTS = ["1+2=3", "12+34=46\n", "x", "The answer is 7.", "9+9=18", "", "40+2=42 and more text here"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_reward_model(tmp_path_factory.mktemp("cache"))


def _hf_one(rm: RewardModel, text: str) -> float:
    """One sequence, no padding, no mask: HF's own pooling has only the last token to pick."""
    ids = torch.tensor([rm.tokenizer(text).input_ids])
    with torch.no_grad():
        return rm.model(input_ids=ids).logits[0, 0].item()


def test_batched_scores_equal_unpadded_hf_forward(model_dir):
    rm = RewardModel(RewardModelSettings(model_name=str(model_dir), batch_size=3))
    try:
        batched = rm.score_texts(TEXTS)
        assert batched == pytest.approx([_hf_one(rm, t) for t in TEXTS], abs=1e-5)
        assert len(set(round(s, 6) for s in batched)) == len(TEXTS)  # the texts really differ
        # order and batch size do not matter
        assert rm.score_texts(TEXTS[::-1])[::-1] == pytest.approx(batched, abs=1e-5)
        one_batch = RewardModel(RewardModelSettings(model_name=str(model_dir), batch_size=64))
        assert one_batch.score_texts(TEXTS) == pytest.approx(batched, abs=1e-5)
        one_batch.close()
    finally:
        rm.close()


def test_long_inputs_keep_their_end(model_dir):
    rm = RewardModel(RewardModelSettings(model_name=str(model_dir), max_length=16))
    try:
        long = "0123456789" * 5 + "1+1=2"
        ids = rm.tokenizer(long, truncation=True, max_length=16).input_ids
        assert len(ids) == 16 and rm.tokenizer.decode(ids, skip_special_tokens=True) == long[-15:]
        [score] = rm.score_texts([long])
        assert score == pytest.approx(_hf_one(rm, long[-15:]), abs=1e-5)
    finally:
        rm.close()


def test_squash_and_correct(model_dir):
    raw = RewardModel(RewardModelSettings(model_name=str(model_dir)))
    squashed = RewardModel(RewardModelSettings(model_name=str(model_dir), squash="sigmoid"))
    items = [ScoreItem("rm", t[:3], t[3:], "") for t in TEXTS]
    try:
        scalars = raw.score_texts(TEXTS)
        assert any(s > 0 for s in scalars) and any(s < 0 for s in scalars)
        plain = asyncio.run(raw.score(items))
        assert [r.reward for r in plain] == pytest.approx(scalars, abs=1e-5)
        assert [r.correct for r in plain] == [s > 0 for s in scalars]
        sig = asyncio.run(squashed.score(items))
        assert [r.reward for r in sig] == pytest.approx([1 / (1 + math.exp(-s)) for s in scalars], abs=1e-5)
        assert [r.correct for r in sig] == [s > 0 for s in scalars]
    finally:
        raw.close()
        squashed.close()


def test_reward_model_task_needs_a_model():
    with pytest.raises(ValidationError, match="reward_model"):
        RewardSettings(tasks={"prefs": "reward_model"})


def test_rejects_a_multi_label_model(tmp_path):
    from transformers import LlamaForSequenceClassification

    from coordinator.embedded.reward_model import DEFAULT_RM_SPEC
    from coordinator.embedded.tiny_model import build_char_tokenizer, build_config

    tokenizer = build_char_tokenizer()
    config = build_config(DEFAULT_RM_SPEC, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                          tokenizer.pad_token_id)
    config.num_labels = 2
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels=2"):
        RewardModel(RewardModelSettings(model_name=str(tmp_path)))


def test_engine_routes_a_mixed_call(model_dir):
    settings = RewardSettings(tasks={"prefs": "reward_model", "arithmetic": "exact"},
                              reward_model=RewardModelSettings(model_name=str(model_dir), batch_size=2))

    async def scenario():
        engine = RewardEngine(settings, structlog.get_logger())
        try:
            await engine.warm_up()
            items = [ScoreItem("prefs", "1+2=", "3", ""), ScoreItem("arithmetic", "1+2=", "3", "3"),
                     ScoreItem("prefs", "9+9=", "18", ""), ScoreItem("arithmetic", "1+2=", "4", "3"),
                     ScoreItem("prefs", "hi", " there", "")]
            return await engine.score(items), engine
        finally:
            engine.close()

    results, engine = asyncio.run(scenario())
    scalars = RewardModel(settings.reward_model).score_texts(["1+2=3", "9+9=18", "hi there"])
    assert [r.reward for r in results[0::2]] == pytest.approx(scalars, abs=1e-5)
    assert [(r.reward, r.correct) for r in results[1::2]] == [(1.0, True), (0.0, False)]


def test_coordinator_config_passes_the_model_through(tmp_path, monkeypatch):
    from coordinator.config import ExperimentConfig
    from coordinator.launch.specs import reward_settings

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    cfg = ExperimentConfig.model_validate({"env": {
        "arithmetic": {}, "prefs": {"scorer": "reward_model", "reward_model": {"batch_size": 4, "squash": "sigmoid"}},
        "mine": {"scorer": "reward_model", "reward_model": {"model_name": "/models/rm", "max_length": 64}}},
        "data": {"default_task": "arithmetic"}})
    embedded = reward_settings(cfg, "prefs")
    assert embedded.tasks == {"prefs": "reward_model"}
    assert embedded.reward_model.model_name.startswith(str(tmp_path / "models" / "tiny-reward-llama-"))
    assert (embedded.reward_model.batch_size, embedded.reward_model.squash) == (4, "sigmoid")
    RewardModel(embedded.reward_model).close()  # the embedded one was built and loads
    assert reward_settings(cfg, "mine").reward_model.model_dump() == {
        "model_name": "/models/rm", "batch_size": 16, "max_length": 64, "dtype": "float32", "squash": "none"}
    assert reward_settings(cfg, "arithmetic").reward_model.model_name is None  # no reward_model task: not built
