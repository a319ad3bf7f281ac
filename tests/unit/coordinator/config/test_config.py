import json
from pathlib import Path

import pytest

from coordinator.config import ConfigError, load_config


def test_defaults_are_the_embedded_demo():
    cfg = load_config()
    assert cfg.policy.model_name is None
    assert cfg.grpo.num_prompts_per_step == 32 and cfg.grpo.num_generations_per_prompt == 8
    assert (cfg.policy.train_global_batch_size, cfg.policy.train_micro_batch_size, cfg.policy.logprob_batch_size) == (
        256, 128, 128)  # the embedded demo's GRPO batch: one optimizer step a GRPO step (config/defaults.py)
    assert cfg.grpo.max_num_steps == 100 and load_config(overrides=["grpo.max_num_steps=60"]).grpo.max_num_steps == 60
    assert cfg.data.dataset_name == "arithmetic"
    assert cfg.cluster.trainer_ranks == 1  # a CPU machine: the fewest ranks the layout needs


@pytest.mark.parametrize("overrides, expected", [
    (["grpo.num_prompts_per_step=16"], (16, 128, 64, 64)),  # one batch key set: none derived
    (["policy.train_micro_batch_size=32"], (16, 128, 32, 64)),
    (["grpo.num_generations_per_prompt=4"], (32, 128, 64, 64)),  # the batch follows the group size
    (["dpo.max_num_steps=2", "data.dataset_name=arithmetic_preference"], (16, 128, 64, 64)),  # no rollouts: none derived
])
def test_the_embedded_demo_batch_is_derived_only_when_no_batch_key_is_set(overrides, expected):
    cfg = load_config(overrides=overrides)
    policy = cfg.policy
    assert (cfg.grpo.num_prompts_per_step, policy.train_global_batch_size, policy.train_micro_batch_size,
            policy.logprob_batch_size) == expected
    assert ("grpo.num_prompts_per_step" in cfg.derived) == (expected[0] == 32)


def test_a_checkpoint_of_yours_gets_no_demo_batch(tmp_path):
    from coordinator.embedded.tiny_model import ensure_tiny_model

    cfg = load_config(overrides=[f"policy.model_name={ensure_tiny_model(tmp_path)}"])
    assert (cfg.grpo.num_prompts_per_step, cfg.policy.train_global_batch_size, cfg.grpo.max_num_steps) == (16, 128, 60)


@pytest.mark.parametrize("overrides, ranks", [
    ([], 1), (["policy.dtensor_cfg.tensor_parallel_size=2"], 2), (["cluster.gpus_per_node=4", "cluster.num_nodes=2"], 8),
    (["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.tensor_model_parallel_size=2",
      "policy.megatron_cfg.pipeline_model_parallel_size=2"], 4), (["cluster.trainer_ranks=3"], 3),
])
def test_trainer_ranks_default_to_what_the_machine_and_layout_need(overrides, ranks):
    assert load_config(overrides=overrides).cluster.trainer_ranks == ranks


def test_service_threads_share_the_cores():
    from coordinator.launch.specs import service_threads

    assert service_threads(load_config(), cores=2) == service_threads(load_config(), cores=2)
    sync = service_threads(load_config(overrides=["cluster.trainer_ranks=2", "cluster.num_generators=2"]), cores=8)
    assert (sync.trainer_rank, sync.generator, sync.reward) == (4, 4, 1)  # turns: each side gets the machine
    overlap = service_threads(load_config(overrides=["grpo.async_grpo.enabled=true"]), cores=8)
    assert (overlap.trainer_rank, overlap.generator) == (4, 4)  # at once: half each
    assert service_threads(load_config(overrides=["cluster.threads_per_service=3"]), cores=8).env("generator") == {
        "OMP_NUM_THREADS": "3"}


def test_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("grpo:\n  max_num_steps: 7\nloss_fn:\n  ratio_clip_max: 0.28\n")
    cfg = load_config(path, ["grpo.max_num_steps=3", "policy.generation.temperature=0.5", "env.math.scorer=math",
                                  "env.arithmetic.scorer=exact", "data.default_task=arithmetic"])
    assert cfg.grpo.max_num_steps == 3
    assert cfg.loss_fn.ratio_clip_max == 0.28
    assert cfg.policy.generation.temperature == 0.5
    assert cfg.env["math"].scorer == "math"


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match=r"unknown key grpo\.num_prompt_per_step"):
        load_config(overrides=["grpo.num_prompt_per_step=4"])


def test_wrong_type_names_the_key(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("policy:\n  train_micro_batch_size: lots\n")
    with pytest.raises(ConfigError, match=r"policy\.train_micro_batch_size"):
        load_config(path)


def test_missing_model_path_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"policy\.model_name.*not a Hugging Face checkpoint"):
        load_config(overrides=[f"policy.model_name={tmp_path / 'nope'}"])


def test_batch_sizes_must_divide():
    with pytest.raises(ConfigError, match="train_global_batch_size"):
        load_config(overrides=["policy.train_global_batch_size=100"])


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_override_syntax():
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(overrides=["grpo.max_num_steps"])


def test_backend_is_resolved_once_into_a_typed_choice():
    from trainer_svc.config import TrainingBackend

    assert load_config().policy.backend is TrainingBackend.DTENSOR


def test_no_backend_enabled_names_both_keys():
    with pytest.raises(ConfigError, match=r"policy\.dtensor_cfg\.enabled.*policy\.megatron_cfg\.enabled"):
        load_config(overrides=["policy.dtensor_cfg.enabled=false"])


def test_megatron_wins_with_a_warning_when_both_are_enabled():
    from trainer_svc.config import TrainingBackend

    with pytest.warns(UserWarning, match="Megatron takes precedence"):
        cfg = load_config(overrides=["policy.megatron_cfg.enabled=true"])
    assert cfg.policy.backend is TrainingBackend.MEGATRON


def test_megatron_alone_needs_no_warning(recwarn):
    from trainer_svc.config import TrainingBackend

    cfg = load_config(overrides=["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"])
    assert cfg.policy.backend is TrainingBackend.MEGATRON
    assert not [w for w in recwarn if "precedence" in str(w.message)]


def test_backend_is_not_a_settable_key():
    with pytest.raises(ConfigError, match="policy.backend is derived"):
        load_config(overrides=["policy.backend=dtensor"])


def test_megatron_refuses_what_only_dtensor_implements():
    with pytest.raises(ConfigError, match=r"sequence_packing is implemented by the DTensor backend only"):
        load_config(overrides=["policy.megatron_cfg.enabled=true", "policy.sequence_packing.enabled=true"])
    recipes = Path(__file__).resolve().parents[4] / "examples" / "configs"
    with pytest.raises(ConfigError, match=r"dpo runs train on the DTensor backend only"):
        load_config(recipes / "dpo.yaml", ["policy.megatron_cfg.enabled=true"])


def _checkpoint(tmp_path, context: int | None = 2048) -> str:
    """A model directory as far as the config looks (its config.json)."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      **({"max_position_embeddings": context} if context else {})}))
    return str(tmp_path)


def test_a_checkpoint_of_yours_gets_no_sft_warm_start_and_lengths_that_fit_it(tmp_path):
    cfg = load_config(overrides=[f"policy.model_name={_checkpoint(tmp_path)}"])
    assert (cfg.sft.max_num_steps, cfg.sft.lr, cfg.sft.stop_at_accuracy) == (0, None, None)
    assert cfg.sft.near_target_val_period is None
    assert cfg.policy.max_total_sequence_length == 1024  # the model's 2048, capped
    assert cfg.policy.generation.max_new_tokens == 512 and cfg.policy.generation.vllm_cfg.max_model_len == 1024
    asked = load_config(overrides=[f"policy.model_name={tmp_path}", "sft.max_num_steps=30",
                                   "policy.max_total_sequence_length=256"])
    assert (asked.sft.max_num_steps, asked.sft.lr) == (30, None)  # the policy's own learning rate
    assert asked.policy.generation.max_new_tokens == 128 and asked.policy.generation.vllm_cfg.max_model_len == 256


def test_the_embedded_demo_keeps_its_warm_start_and_lengths():
    cfg = load_config()
    assert (cfg.sft.max_num_steps, cfg.sft.lr, cfg.sft.stop_at_accuracy) == (2000, 1e-3, 0.40)
    assert cfg.sft.near_target_val_period == 10
    assert (cfg.policy.max_total_sequence_length, cfg.policy.generation.max_new_tokens) == (64, 4)
    assert cfg.policy.generation.vllm_cfg.max_model_len == 64
    assert load_config(overrides=["sft.max_num_steps=0"]).sft.max_num_steps == 0


def test_lengths_that_do_not_fit_name_the_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"max_new_tokens \(64\) leaves no room for a prompt"):
        load_config(overrides=["policy.generation.max_new_tokens=64"])
    with pytest.raises(ConfigError, match=r"vllm_cfg.max_model_len \(32\)"):
        load_config(overrides=["policy.generation.max_new_tokens=40", "policy.generation.vllm_cfg.max_model_len=32"])
    with pytest.raises(ConfigError, match=r"max_total_sequence_length \(4096\) exceeds the model's context length"):
        load_config(overrides=[f"policy.model_name={_checkpoint(tmp_path)}", "policy.max_total_sequence_length=4096"])


def test_default_task_is_the_one_env_or_must_be_named():
    assert load_config(overrides=["env={math: {scorer: math}}"]).data.default_task == "math"
    two = ["env.math.scorer=math", "env.arithmetic.scorer=exact"]
    with pytest.raises(ConfigError, match=r"data.default_task is required with several env tasks \(arithmetic, math\)"):
        load_config(overrides=two)
    assert load_config(overrides=[*two, "data.default_task=math"]).data.default_task == "math"
