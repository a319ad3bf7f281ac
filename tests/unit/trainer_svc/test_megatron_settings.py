"""policy.megatron_cfg from the YAML to the trainer's settings: NeMo-RL key names, typos
refused, backend precedence, and options that cannot run here refused with the key named."""

import pytest
from pydantic import ValidationError

from coordinator.config import ConfigError, load_config
from coordinator.launch.specs import trainer_settings
from trainer_svc.backends.megatron.convert import Arch
from trainer_svc.backends.megatron.model import check_supported
from trainer_svc.config import TrainerSettings
from trainer_svc.config.megatron import MegatronSettings

ARCH = Arch("llama", num_layers=4, hidden_size=128, ffn_hidden_size=512, num_heads=4, num_kv_heads=2, head_dim=32,
            vocab_size=82, max_position_embeddings=64, rope_theta=1e4, norm_eps=1e-6, qkv_bias=False,
            tie_word_embeddings=False)


def test_megatron_cfg_keys_reach_the_trainer_settings():
    cfg = load_config(overrides=[
        "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.tensor_model_parallel_size=2", "policy.megatron_cfg.pipeline_model_parallel_size=2",
        "policy.megatron_cfg.optimizer.use_distributed_optimizer=true", "policy.megatron_cfg.optimizer.lr=3e-4",
        "policy.megatron_cfg.scheduler.lr_warmup_iters=5", "policy.megatron_cfg.activation_checkpointing=true"])
    settings = trainer_settings(cfg, "/models/x")
    assert settings.backend == "megatron"
    m = settings.megatron_cfg
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size) == (2, 2)
    assert m.optimizer.use_distributed_optimizer and m.optimizer.lr == 3e-4 and m.scheduler.lr_warmup_iters == 5
    assert m.recompute == ("full", "uniform", 1)


def test_a_typo_under_megatron_cfg_names_the_key():
    with pytest.raises(ConfigError, match=r"policy\.megatron_cfg\.optimizer\.use_distributed_optimiser"):
        load_config(overrides=["policy.megatron_cfg.optimizer.use_distributed_optimiser=true"])


def test_trainer_settings_precedence_and_neither():
    both = TrainerSettings(model_name="m", megatron_cfg={"enabled": True})
    assert both.backend == "megatron"
    assert TrainerSettings(model_name="m").backend == "dtensor"
    with pytest.raises(ValidationError, match="dtensor_cfg.enabled=true or megatron_cfg.enabled=true"):
        TrainerSettings(model_name="m", dtensor_cfg={"enabled": False})


def test_inconsistent_options_are_refused_at_load():
    with pytest.raises(ValidationError, match="sequence_parallel needs tensor_model_parallel_size > 1"):
        MegatronSettings(sequence_parallel=True)
    with pytest.raises(ValidationError, match="average_in_collective must be false"):
        MegatronSettings(distributed_data_parallel_config={"average_in_collective": True})


@pytest.mark.parametrize("options, message", [
    ({"context_parallel_size": 2}, "context_parallel_size > 1"),
    ({"optimizer": {"fp16": True}}, "optimizer.fp16"),
    ({"apply_rope_fusion": True}, "apply_rope_fusion"),
    ({"gradient_accumulation_fusion": True}, "gradient_accumulation_fusion"),
    ({"optimizer": {"use_precision_aware_optimizer": True}}, "use_precision_aware_optimizer"),
])
def test_gpu_only_options_fail_clearly_on_cpu(options, message):
    with pytest.raises(ValueError, match=message):
        check_supported(MegatronSettings(enabled=True, **options), ARCH, world_size=2, on_gpu=False)


@pytest.mark.parametrize("options, world, message", [
    ({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, 2, "not a multiple"),
    ({"pipeline_model_parallel_size": 3}, 3, "do not split evenly"),
    ({"tensor_model_parallel_size": 4}, 4, "key/value heads"),
    ({"expert_model_parallel_size": 2}, 2, "mixture-of-experts"),
])
def test_impossible_layouts_name_the_key(options, world, message):
    with pytest.raises(ValueError, match=message):
        check_supported(MegatronSettings(enabled=True, **options), ARCH, world_size=world, on_gpu=True)


@pytest.mark.parametrize("recipe", ["grpo_megatron", "dapo_megatron"])
def test_megatron_recipes_load_and_choose_megatron(recipe):
    from pathlib import Path

    from trainer_svc.config import TrainingBackend

    path = Path(__file__).resolve().parents[3] / "examples" / "configs" / f"{recipe}.yaml"
    cfg = load_config(path)
    assert cfg.policy.backend is TrainingBackend.MEGATRON
    m = cfg.policy.megatron_cfg
    assert cfg.cluster.trainer_ranks % (m.tensor_model_parallel_size * m.pipeline_model_parallel_size) == 0
