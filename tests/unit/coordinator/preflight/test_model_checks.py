"""Early model checks (coordinator/preflight/model.py): every failure is a ConfigError naming the
key or file and what to change, raised by the model and data stages of the pre-flight checks, which
every run makes before any service starts (coordinator/preflight/inputs.py)."""

import json

import pytest
from safetensors.torch import load_file, save_file

from coordinator.config import ConfigError, load_config
from coordinator.data.inputs import prepare_model
from coordinator.embedded.tiny_model import build_tiny_model
from coordinator.preflight import Preflight
from coordinator.preflight import model as mc
from trainer_svc.config import TrainingBackend


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def edited(tiny, tmp_path, **changes):
    """A copy of the tiny checkpoint with config.json keys changed (None removes one)."""
    import shutil

    out = shutil.copytree(tiny, tmp_path / "edited")
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


def load(model, *overrides):
    """The config, checked as a run's start checks it."""
    return checked(f"policy.model_name={model}", *overrides)


def checked(*overrides):
    cfg = load_config(overrides=list(overrides))
    checks = Preflight(cfg, model_dir=prepare_model(cfg))
    checks.model_config = mc.check_model(cfg)  # the model stage less the files' own checks (test_input_checks.py)
    checks.data()
    return cfg


def test_the_tiny_checkpoint_passes(tiny):
    assert load(tiny).policy.model_name == str(tiny)


def test_config_json_that_does_not_parse_names_the_file(tiny, tmp_path):
    model = edited(tiny, tmp_path)
    (model / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json is not valid JSON.*re-export"):
        load(model)


def test_missing_architectures_and_non_causal_lm_are_refused(tiny, tmp_path):
    with pytest.raises(ConfigError, match="names no `architectures`"):
        load(edited(tiny, tmp_path, architectures=None))
    with pytest.raises(mc.ModelCheckError, match="BertForMaskedLM is not a causal language model"):
        mc.check_architecture({"architectures": ["BertForMaskedLM"]}, TrainingBackend.DTENSOR, ["LlamaForCausalLM"])


def test_megatron_takes_only_the_converter_families():
    with pytest.raises(mc.ModelCheckError, match=r"policy.megatron_cfg.enabled: .*Qwen3ForCausalLM: set "
                                                 r"policy.megatron_cfg.enabled=false"):
        mc.check_architecture({"architectures": ["Qwen3ForCausalLM"]}, TrainingBackend.MEGATRON, ["Qwen3ForCausalLM"])
    assert mc.check_architecture({"architectures": ["Qwen2ForCausalLM"]}, TrainingBackend.MEGATRON,
                                 ["Qwen2ForCausalLM"]) is None


def test_megatron_refusals_of_the_converter_are_said_at_load(tiny, tmp_path):
    model = edited(tiny, tmp_path, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(ConfigError, match=r"policy.megatron_cfg.enabled: this checkpoint cannot be converted "
                                          r"\(rope scaling 'linear'"):
        load(model, "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false")
    load(tiny, "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false")


def test_an_untested_family_is_a_warning_not_an_error():
    message = mc.check_architecture({"architectures": ["Phi3ForCausalLM"]}, TrainingBackend.DTENSOR,
                                    ["Phi3ForCausalLM"])
    assert "not among the families" in message and "grpo.max_token_mult_prob_error" in message


def test_head_size_16_is_refused_on_vllm_cpu(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(mc, "vllm_on_cpu", lambda: True)
    model = edited(tiny, tmp_path, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=None)
    with pytest.raises(ConfigError, match=r"head size 16 .*hidden_size 64 / num_attention_heads 4.* supports \(32, "):
        load(model)
    monkeypatch.setattr(mc, "vllm_on_cpu", lambda: False)  # a GPU build of vLLM serves it
    load(model)


def test_head_dim_key_wins_over_the_quotient():
    assert mc.head_size({"head_dim": 64, "hidden_size": 128, "num_attention_heads": 4}) == 64
    with pytest.raises(mc.ModelCheckError, match="head size 24"):
        mc.check_head_size({"head_dim": 24, "hidden_size": 96, "num_attention_heads": 4}, mc.VLLM_CPU_HEAD_SIZES)


def test_dtype_and_quantization(tiny, tmp_path):
    with pytest.raises(ConfigError, match="dtype 'int8' is not one vLLM serves"):
        load(edited(tiny, tmp_path, dtype="int8"))
    with pytest.raises(mc.ModelCheckError, match="quantization_config"):
        mc.check_dtype({"quantization_config": {"quant_method": "gptq"}})


def test_max_model_len_beyond_the_positions_is_refused(tiny):
    # refused when the config loads (coordinator/config/defaults.py reads the model's context length)
    with pytest.raises(ConfigError, match=r"max_model_len \(128\) exceeds the model's context length \(64"):
        load(tiny, "policy.generation.vllm_cfg.max_model_len=128")
    with pytest.raises(mc.ModelCheckError, match=r"max_model_len \(128\) exceeds the model's "
                                                 r"max_position_embeddings \(64\).*<= 64"):
        mc.check_max_length({"max_position_embeddings": 64}, 128)


def test_prompt_plus_new_tokens_must_fit_max_model_len(tiny, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"prompt": "x" * 40, "answer": "1"}) + "\n")
    with pytest.raises(ConfigError, match=r"data.train_path .*: 1 of 1 prompts are too long for the generators: "
                                          r"prompt \+ policy.generation.max_new_tokens \(30\).* has 41 tokens.*at least 71"):
        load(tiny, "data.dataset_name=jsonl", f"data.train_path={rows}", "policy.generation.max_new_tokens=30")
    with pytest.raises(ConfigError, match="the embedded arithmetic task: 8100 of 8100 prompts .* '99\\+99=' has 7 tokens"):
        checked("policy.generation.max_new_tokens=60")  # the embedded model and task


def test_missing_data_file_names_the_key(tiny, tmp_path):
    with pytest.raises(ConfigError, match="data.train_path: .*nope.jsonl does not exist"):
        load(tiny, "data.dataset_name=jsonl", f"data.train_path={tmp_path / 'nope.jsonl'}")


def test_missing_tokenizer_files_are_named(tiny, tmp_path):
    model = edited(tiny, tmp_path)
    (model / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"no tokenizer files \(tokenizer.json or tokenizer.model or vocab.json"):
        load(model)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tiny, tmp_path):
    with pytest.raises(ConfigError, match="the tokenizer has 82 tokens but config.json vocab_size is 40"):
        load(edited(tiny, tmp_path, vocab_size=40))


def test_tied_config_with_a_different_lm_head_is_refused(tiny, tmp_path):
    model = edited(tiny, tmp_path, tie_word_embeddings=True)  # the tiny model's lm_head is its own
    with pytest.raises(ConfigError, match="tie_word_embeddings: true but .* holds an lm_head.weight that differs"):
        load(model)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    load(model)  # a redundant copy of the embedding is fine


def test_the_cpu_head_sizes_are_vllms():
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == mc.VLLM_CPU_HEAD_SIZES
