"""DPO / RM configuration, the recipes, the toy preference pairs and the trainer samples they become."""

import json
from pathlib import Path

import pytest

from coordinator.algorithms.pairs import policy_samples, reward_model_samples
from coordinator.config import ConfigError, load_config
from coordinator.config.data import DataConfig
from coordinator.config.preference import Algorithm
from coordinator.data.preference import PreferencePair, read_pairs
from coordinator.data.tokens import Tokens
from coordinator.embedded.preference import ensure_preference_dataset, make_preference_splits
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import trainer_settings
from trainer_svc.types import DpoLossConfig

RECIPES = Path(__file__).resolve().parents[4] / "examples" / "configs"
PAIRS = {"data": {"dataset_name": "arithmetic_preference"}}


@pytest.mark.parametrize("recipe, algorithm", [("grpo", Algorithm.GRPO), ("dapo", Algorithm.GRPO),
                                               ("sft", Algorithm.GRPO), ("dpo", Algorithm.DPO),
                                               ("rm", Algorithm.RM)])
def test_each_recipe_loads_on_the_dtensor_backend_with_the_embedded_model(recipe, algorithm):
    cfg = load_config(RECIPES / f"{recipe}.yaml")
    assert cfg.algorithm is algorithm
    assert cfg.policy.backend.value == "dtensor" and cfg.policy.model_name is None


def test_the_dapo_recipe_turns_on_every_dapo_feature():
    grpo = load_config(RECIPES / "dapo.yaml").grpo
    assert grpo.use_dynamic_sampling and grpo.overlong_filtering and grpo.reward_shaping.enabled


def test_dpo_section_maps_to_the_trainer_loss():
    cfg = load_config(raw={**PAIRS, "dpo": {"reference_policy_kl_penalty": 0.2, "sft_loss_weight": 0.5,
                                            "sft_average_log_probs": True}})
    assert cfg.algorithm is Algorithm.DPO
    assert cfg.dpo.trainer_loss() == DpoLossConfig(reference_policy_kl_penalty=0.2, sft_loss_weight=0.5, sft_average_log_probs=True)
    assert "algorithm" not in cfg.model_dump()  # derived, never written back into config.yaml


@pytest.mark.parametrize("raw, message", [
    ({**PAIRS, "dpo": {}, "rm": {}, "policy": {"reward_model_cfg": {"enabled": True}}}, "at most one of the dpo, rm, distillation and ppo"),
    ({**PAIRS, "rm": {}}, "reward_model_cfg.enabled"),
    ({"policy": {"reward_model_cfg": {"enabled": True}}}, "reward_model_cfg.enabled"),
    ({"dpo": {}}, "data.dataset_name"),
    ({**PAIRS}, "for a dpo or rm run"),
    ({**PAIRS, "dpo": {}, "policy": {"train_global_batch_size": 3}, "cluster": {"trainer_ranks": 2}},
     "multiple of cluster.trainer_ranks"),
    ({**PAIRS, "dpo": {"preference_loss_weight": 0.0}}, "nothing to train"),
    ({**PAIRS, "dpo": {"beta": 0.1}}, "unknown key dpo.beta"),
])
def test_preference_config_mistakes_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        load_config(raw=raw)


def test_the_rm_trainer_gets_the_reward_model_setting(tmp_path):
    cfg = load_config(RECIPES / "rm.yaml")
    assert trainer_settings(cfg, str(tmp_path)).reward_model_cfg.enabled
    assert not trainer_settings(load_config(RECIPES / "dpo.yaml"), str(tmp_path)).reward_model_cfg.enabled


def test_toy_pairs_prefer_the_answer_over_letters_on_disjoint_prompts(tmp_path):
    train, val = make_preference_splits(0, 300, 50)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in val}
    for pair in train + val:
        a, b = pair["prompt"].rstrip("=").split("+")
        assert pair["chosen"] == str(int(a) + int(b))
        assert pair["rejected"].isalpha() and len(pair["rejected"]) == len(pair["chosen"])
    train_path, _ = ensure_preference_dataset(tmp_path, 0, 300, 50)
    assert len(read_pairs(train_path, DataConfig(dataset_name="arithmetic_preference"))) == 300


def test_read_pairs_names_missing_keys(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "c"}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:1: missing keys \['rejected'\]"):
        read_pairs(path, DataConfig(dataset_name="arithmetic_preference"))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Tokens:
    return Tokens(str(ensure_tiny_model(tmp_path_factory.mktemp("cache"))))


def test_dpo_samples_are_chosen_then_rejected_with_eos(tokens):
    samples = policy_samples(tokens, [PreferencePair("1+2=", "3", "ab")])
    prompt = tokens.prompt("1+2=")
    assert [s.token_ids for s in samples] == [prompt + tokens.answer("3"), prompt + tokens.answer("ab")]
    assert all(s.prompt_length == len(prompt) for s in samples)
    assert samples[0].token_ids[-1] == tokens.eos_id


def test_rm_samples_are_tokenised_as_reward_svc_reads_them(tokens):
    samples = reward_model_samples(tokens, [PreferencePair("1+2=", "3", "ab")])
    assert [s.token_ids for s in samples] == [tokens.prompt("1+2=3"), tokens.prompt("1+2=ab")]  # no EOS
    assert samples[0].prompt_length == len(tokens.prompt("1+2="))


def test_a_broken_jsonl_line_is_named(tmp_path):
    from coordinator.config import load_config
    from coordinator.data.preference import read_pairs

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "x"}\n{"prompt": "2+2=", "chosen": \n')
    with pytest.raises(ValueError, match=r"pairs\.jsonl:2: not a JSON object"):
        read_pairs(path, load_config().data)
    path.write_text('{"prompt": "1+1=", "chosen": "2"}\n')
    with pytest.raises(ValueError, match=r"pairs\.jsonl:1: missing keys \['rejected'\]"):
        read_pairs(path, load_config().data)
