"""benchmarks/vs_trl_settings.py: the shared settings become the TRL GRPOConfig arguments and the
Tandem overrides the benchmark states, those overrides load (and pass the model checks) for both
cases of benchmarks/vs_trl.py, and each pair of corresponding keys carries the same value.
No TRL import: TRL is the bench extra's, not the suite's; benchmarks/vs_trl_trl.py builds
trl.GRPOConfig from the same keyword arguments, so a key TRL does not take stops the benchmark at once."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from rl_bench import HEAVY_SPEC, write_task
from vs_trl_settings import SharedSettings, tandem_overrides, trl_kwargs

from coordinator.config import load_config
from coordinator.embedded.tiny_model import DEFAULT_SPEC, build_char_tokenizer, build_config
from coordinator.preflight import Preflight
from coordinator.preflight.model import check_model

TINY = SharedSettings()
HEAVY = SharedSettings(num_steps=10, max_new_tokens=64, max_total_length=128)


def test_the_tiny_case_maps_to_these_trl_arguments():
    assert trl_kwargs(TINY, "out") == {
        "output_dir": "out", "per_device_train_batch_size": 128, "gradient_accumulation_steps": 1,
        "num_generations": 8, "steps_per_generation": 1, "num_iterations": 1, "max_steps": 60,
        "max_completion_length": 4, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "use_vllm": False,
        "vllm_importance_sampling_correction": False, "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.2,
        "beta": 0.04, "scale_rewards": "group", "mask_truncated_completions": False, "learning_rate": 1e-5,
        "lr_scheduler_type": "constant", "warmup_steps": 0, "optim": "adamw_torch", "adam_beta1": 0.9,
        "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0, "bf16": False,
        "fp16": False, "gradient_checkpointing": False, "use_cpu": True, "seed": 42, "report_to": "none",
        "save_strategy": "no", "logging_steps": 1, "log_completions": False, "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def test_sequence_level_loss_and_no_std_scaling_map_to_both_sides():
    s = SharedSettings(token_level_loss=False, scale_rewards_by_group_std=False)
    kwargs = trl_kwargs(s, "out")
    assert (kwargs["loss_type"], kwargs["scale_rewards"]) == ("grpo", "none")
    overrides = _overrides(s, Path("m"), Path("t"))
    assert "loss_fn.token_level_loss=false" in overrides and "grpo.normalize_rewards=false" in overrides


def _write_model(out_dir: Path, spec) -> Path:
    """config.json and tokenizer of `spec` (no weights: what config loading and the model checks read)."""
    tokenizer = build_char_tokenizer()
    config = build_config(spec, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    config.architectures = ["LlamaForCausalLM"]  # what save_pretrained of the model records
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _overrides(s: SharedSettings, model_dir: Path, task_dir: Path) -> list[str]:
    return tandem_overrides(s, model_dir=str(model_dir), train_path=str(task_dir / "train.jsonl"),
                            val_path=str(task_dir / "val.jsonl"), num_val=100, log_dir=str(task_dir / "runs"),
                            run_name="r")


@pytest.mark.parametrize("settings, spec", [(TINY, DEFAULT_SPEC), (HEAVY, HEAVY_SPEC)], ids=["tiny", "heavy"])
def test_the_tandem_overrides_load_and_agree_with_the_trl_arguments(tmp_path, settings, spec):
    model_dir = _write_model(tmp_path / "model", spec)
    task = write_task(tmp_path / "task", num_val=100)
    cfg = load_config(overrides=_overrides(settings, model_dir, tmp_path / "task"))
    checks = Preflight(cfg, model_dir=str(model_dir), model_config=check_model(cfg))  # a model without weights
    checks.data()  # the lengths fit the model and vLLM's bounds, before any service starts
    trl = trl_kwargs(settings, "out")
    policy, loss = cfg.policy, cfg.loss_fn
    pairs = [  # (Tandem's value, TRL's value) for each pair of corresponding keys
        (cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt, trl["per_device_train_batch_size"]),
        (policy.train_global_batch_size, trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"]),
        (policy.train_micro_batch_size, trl["per_device_train_batch_size"]),
        (cfg.grpo.num_generations_per_prompt, trl["num_generations"]),
        (cfg.grpo.max_num_steps, trl["max_steps"]),
        (policy.generation.max_new_tokens, trl["max_completion_length"]),
        (policy.generation.temperature, trl["temperature"]), (policy.generation.top_p, trl["top_p"]),
        (policy.generation.top_k, None if trl["top_k"] == 0 else trl["top_k"]),
        (loss.ratio_clip_min, trl["epsilon"]), (loss.ratio_clip_max, trl["epsilon_high"]),
        (loss.reference_policy_kl_penalty, trl["beta"]), (loss.reference_policy_kl_type, "k3"),
        ((loss.kl_input_clamp_value, loss.kl_output_clamp_value), (None, None)),  # TRL clamps nothing
        (loss.token_level_loss, trl["loss_type"] == "dapo"),
        (loss.use_importance_sampling_correction, trl["vllm_importance_sampling_correction"]),
        (cfg.grpo.use_leave_one_out_baseline, False),  # TRL's baseline is the group mean
        (cfg.grpo.normalize_rewards, trl["scale_rewards"] == "group"),
        (cfg.grpo.overlong_filtering, trl["mask_truncated_completions"]),
        (policy.optimizer.kwargs.lr, trl["learning_rate"]),
        (policy.optimizer.kwargs.betas, (trl["adam_beta1"], trl["adam_beta2"])),
        (policy.optimizer.kwargs.eps, trl["adam_epsilon"]), (policy.optimizer.kwargs.weight_decay, trl["weight_decay"]),
        (policy.max_grad_norm, trl["max_grad_norm"]), (policy.precision == "float32", not trl["bf16"]),
        (policy.dtensor_cfg.activation_checkpointing, trl["gradient_checkpointing"]),
        (cfg.grpo.seed, trl["seed"]),
    ]
    for tandem_value, trl_value in pairs:
        assert tandem_value == trl_value
    assert cfg.sft.max_num_steps == 0 and cfg.policy.model_name == str(model_dir)
    assert cfg.data.train_path == str(task.train_path) and cfg.grpo.max_val_samples == 100
    assert cfg.checkpointing.enabled and cfg.checkpointing.save_period == settings.num_steps  # the final weights

