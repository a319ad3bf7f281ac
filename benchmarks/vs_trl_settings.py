"""The settings benchmarks/vs_trl.py gives Hugging Face TRL's GRPOTrainer and Tandem, in one place.

`SharedSettings` holds each setting once; `trl_kwargs` maps it to `trl.GRPOConfig` keyword
arguments and `tandem_overrides` to Tandem's dotted config overrides. Every key that matters
for the algorithm or its cost is set explicitly on both sides (the comments name the key that
corresponds on the other side), including the TRL defaults that would otherwise differ
(bf16 on, gradient checkpointing on, a linear learning-rate decay) and Tandem's defaults that
would otherwise differ (leave-one-out baseline, KL clamps, importance-sampling correction).

Neither TRL nor Tandem's services are imported here: tests/unit/benchmarks/test_vs_trl_settings.py
checks the mapping without them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SharedSettings:
    """One GRPO experiment, as both systems run it (defaults: the tiny task of issue 13)."""

    num_prompts_per_step: int = 16
    """Distinct prompts per optimizer step."""
    num_generations: int = 8
    """Completions sampled per prompt (the group)."""
    max_new_tokens: int = 4
    """Completion budget in tokens."""
    max_total_length: int = 64
    """Longest prompt + completion (Tandem's trainer and vLLM engine; TRL needs no bound)."""
    temperature: float = 1.0
    top_p: float = 1.0
    clip_epsilon: float = 0.2
    """Symmetric ratio clip: [1 - eps, 1 + eps]."""
    kl_beta: float = 0.04
    """Coefficient of the k3 KL-to-reference term in the loss."""
    token_level_loss: bool = True
    """True: mean over all completion tokens of the step; False: per-sequence mean, then mean."""
    scale_rewards_by_group_std: bool = True
    """Advantage = (reward - group mean) / group std (TRL's GRPO); False: no std division."""
    learning_rate: float = 1e-5
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    num_steps: int = 60
    seed: int = 42
    importance_sampling_correction: bool = False
    """Weight tokens by exp(trainer - generator logprob). TRL generates with the trained model
    itself (transformers' generate), so it has no such term; Tandem's vLLM generator would."""

    @property
    def samples_per_step(self) -> int:
        return self.num_prompts_per_step * self.num_generations


def trl_kwargs(s: SharedSettings, output_dir: str) -> dict:
    """Keyword arguments of trl.GRPOConfig for `s` (one process, CPU, no vLLM)."""
    return {
        "output_dir": output_dir,
        # Batch: TRL counts completions. One generation batch of samples_per_step completions is one
        # optimizer step (steps_per_generation 1, num_iterations 1), as Tandem's
        # grpo.num_prompts_per_step x grpo.num_generations_per_prompt = policy.train_global_batch_size.
        "per_device_train_batch_size": s.samples_per_step,  # Tandem policy.train_global_batch_size (and micro)
        "gradient_accumulation_steps": 1,  # one forward/backward per step: Tandem train_micro_batch_size = global
        "num_generations": s.num_generations,  # Tandem grpo.num_generations_per_prompt
        "steps_per_generation": 1,
        "num_iterations": 1,  # Tandem: one optimizer step per batch (always)
        "max_steps": s.num_steps,  # Tandem grpo.max_num_steps
        # Sampling (transformers' generate; Tandem: vLLM)
        "max_completion_length": s.max_new_tokens,  # Tandem policy.generation.max_new_tokens
        "temperature": s.temperature,  # Tandem policy.generation.temperature
        "top_p": s.top_p,  # Tandem policy.generation.top_p
        "top_k": 0,  # off; Tandem policy.generation.top_k null
        "use_vllm": False,
        "vllm_importance_sampling_correction": s.importance_sampling_correction,  # used only with use_vllm
        # Loss
        "loss_type": "dapo" if s.token_level_loss else "grpo",  # Tandem loss_fn.token_level_loss; with one
        # accumulation window "dapo" divides by the step's completion tokens, as Tandem's token-level mean
        "epsilon": s.clip_epsilon,  # Tandem loss_fn.ratio_clip_min
        "epsilon_high": s.clip_epsilon,  # Tandem loss_fn.ratio_clip_max
        "beta": s.kl_beta,  # Tandem loss_fn.reference_policy_kl_penalty; TRL's estimator is k3, unclamped
        "scale_rewards": "group" if s.scale_rewards_by_group_std else "none",  # Tandem grpo.normalize_rewards
        # (TRL's baseline is the group mean: Tandem grpo.use_leave_one_out_baseline false)
        "mask_truncated_completions": False,  # Tandem grpo.overlong_filtering false
        # Optimizer: torch.optim.AdamW with a constant learning rate, as Tandem's trainer
        "learning_rate": s.learning_rate,  # Tandem policy.optimizer.kwargs.lr
        "lr_scheduler_type": "constant",  # TRL's default decays linearly; Tandem has no schedule
        "warmup_steps": 0,
        "optim": "adamw_torch",  # torch.optim.AdamW (Tandem's); TRL's default is the fused variant
        "adam_beta1": s.adam_betas[0],  # Tandem policy.optimizer.kwargs.betas
        "adam_beta2": s.adam_betas[1],
        "adam_epsilon": s.adam_eps,  # Tandem policy.optimizer.kwargs.eps
        "weight_decay": s.weight_decay,  # Tandem policy.optimizer.kwargs.weight_decay
        "max_grad_norm": s.max_grad_norm,  # Tandem policy.max_grad_norm
        # Numerics and memory: fp32, no activation recomputation (TRL defaults: bf16, checkpointing on)
        "bf16": False,  # Tandem policy.precision float32
        "fp16": False,
        "gradient_checkpointing": False,  # Tandem policy.dtensor_cfg.activation_checkpointing false
        "use_cpu": True,
        "seed": s.seed,  # Tandem grpo.seed (each system draws its own prompt order and samples)
        # Bookkeeping: nothing written during training (Tandem: tensorboard and plot off)
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "log_completions": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def tandem_overrides(s: SharedSettings, *, model_dir: str, train_path: str, val_path: str, num_val: int,
                     log_dir: str, run_name: str) -> list[str]:
    """Dotted overrides of `tandem run` for `s`. The run checkpoints once, after its last step
    (the benchmark reads the final weights from there), and validates only before and after."""
    return [
        f"policy.model_name={model_dir}",
        "data.dataset_name=jsonl", f"data.train_path={train_path}", f"data.val_path={val_path}",
        "sft.max_num_steps=0",  # both start from the same warm-started checkpoint
        # Batch (TRL per_device_train_batch_size = samples per step, num_generations, max_steps)
        f"grpo.num_prompts_per_step={s.num_prompts_per_step}",
        f"grpo.num_generations_per_prompt={s.num_generations}",
        f"grpo.max_num_steps={s.num_steps}",
        f"policy.train_global_batch_size={s.samples_per_step}",
        f"policy.train_micro_batch_size={s.samples_per_step}",  # TRL gradient_accumulation_steps 1
        f"policy.logprob_batch_size={s.samples_per_step}",
        f"policy.max_total_sequence_length={s.max_total_length}",
        f"policy.generation.vllm_cfg.max_model_len={s.max_total_length}",
        # Sampling (TRL max_completion_length, temperature, top_p, top_k 0)
        f"policy.generation.max_new_tokens={s.max_new_tokens}",
        f"policy.generation.temperature={s.temperature}",
        f"policy.generation.top_p={s.top_p}",
        "policy.generation.top_k=null",
        # Advantages: TRL's group-mean baseline and scale_rewards
        "grpo.use_leave_one_out_baseline=false",
        f"grpo.normalize_rewards={str(s.scale_rewards_by_group_std).lower()}",
        "grpo.overlong_filtering=false",  # TRL mask_truncated_completions
        # Loss (TRL epsilon / epsilon_high, beta with k3 unclamped, loss_type)
        f"loss_fn.ratio_clip_min={s.clip_epsilon}",
        f"loss_fn.ratio_clip_max={s.clip_epsilon}",
        f"loss_fn.reference_policy_kl_penalty={s.kl_beta}",
        "loss_fn.reference_policy_kl_type=k3",
        "loss_fn.kl_input_clamp_value=null",
        "loss_fn.kl_output_clamp_value=null",
        f"loss_fn.token_level_loss={str(s.token_level_loss).lower()}",
        f"loss_fn.use_importance_sampling_correction={str(s.importance_sampling_correction).lower()}",
        # Optimizer (TRL learning_rate, adam_beta1/2, adam_epsilon, weight_decay, max_grad_norm; constant lr)
        f"policy.optimizer.kwargs.lr={s.learning_rate}",
        f"policy.optimizer.kwargs.betas=[{s.adam_betas[0]}, {s.adam_betas[1]}]",
        f"policy.optimizer.kwargs.eps={s.adam_eps}",
        f"policy.optimizer.kwargs.weight_decay={s.weight_decay}",
        f"policy.max_grad_norm={s.max_grad_norm}",
        # Numerics (TRL bf16/fp16 false, gradient_checkpointing false)
        "policy.precision=float32",
        "policy.dtensor_cfg.activation_checkpointing=false",
        f"grpo.seed={s.seed}",
        # Validation before and after only, on the same held-out rows the benchmark scores
        "grpo.val_period=0", f"grpo.max_val_samples={num_val}",
        # Bookkeeping: one checkpoint after the last step holds the final weights (TRL save_model)
        "checkpointing.enabled=true", f"checkpointing.save_period={max(s.num_steps, 1)}", "checkpointing.keep_top_k=1",
        f"logger.log_dir={log_dir}", f"logger.run_name={run_name}",
        "logger.tensorboard_enabled=false", "logger.plot_enabled=false",  # TRL report_to none
    ]
