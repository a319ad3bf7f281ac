"""Defaults that depend on the model and on the other sections, filled in once at load for the
keys a config leaves unset (a key that is set is never changed):

- The embedded tiny model (`policy.model_name` unset) starts from random weights: it gets the
  demo's SFT warm start (sft.max_num_steps 2000, lr 1e-3, stop at 40% held-out accuracy, checked
  every 10 steps instead of 50 once a check has reached 20%, so that it stops near 40% rather
  than up to 20 points past it: benchmarks/results/2026-11-28-demo.md) and the embedded task's
  lengths (64 tokens in all, 4 new ones: 3 digits and EOS). Its GRPO (or DAPO) run, when the config
  sets none of the batch keys below, draws 32 prompts a step instead of 16, all of a step's
  samples in one optimizer step (train_global_batch_size = 32 x num_generations_per_prompt) in
  two micro-batches: from the same warm start GRPO then climbs at every held-out check instead
  of swinging by ~10 points between them (+25.8 and +26.6 points against +21.2 and +19.8 at 16
  prompts: benchmarks/results/2026-11-28-demo.md); and, unless grpo.max_num_steps is set, 100
  steps instead of 60: the held-out accuracy still climbs past step 60 (63% there, 79% at 100).
- A checkpoint of yours gets what NeMo-RL's GRPO does: no SFT warm start unless the config asks
  for one (and then with the policy's own learning rate, for sft.max_num_steps steps),
  policy.max_total_sequence_length = the model's context length capped at 1024, and half of it
  for new tokens.
- vLLM's max_model_len follows policy.max_total_sequence_length (NeMo-RL's interpolation).
- data.default_task is the env's one task when there is one; with several it must be named.

Then the lengths must fit: new tokens leave room for a prompt, and nothing exceeds the model's
context. `derived_defaults` returns the sections to replace and, per dotted key, why it has its
value (`tandem config` shows it as that key's source).
"""

from __future__ import annotations

import json
from pathlib import Path

EMBEDDED_SFT = {"max_num_steps": 2000, "lr": 1e-3, "stop_at_accuracy": 0.40, "near_target_val_period": 10}
CHECKPOINT_SFT = {"max_num_steps": 0, "lr": None, "stop_at_accuracy": None, "near_target_val_period": None}
EMBEDDED_PROMPTS_PER_STEP = 32
EMBEDDED_GRPO_STEPS = 100
BATCH_KEYS = ("grpo.num_prompts_per_step", "policy.train_global_batch_size", "policy.train_micro_batch_size",
              "policy.logprob_batch_size")
EMBEDDED_LENGTHS = {"max_total_sequence_length": 64, "max_new_tokens": 4}
CHECKPOINT_MAX_LENGTH = 1024
EMBEDDED = "the embedded tiny model's"
CHECKPOINT = "for a checkpoint"


def context_length(model_dir: str | None) -> int | None:
    """The model's max_position_embeddings (or its equivalent) from its config.json; None if unknown."""
    if model_dir is None:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = {**config.get("text_config", {}), **config}
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def derived_defaults(cfg) -> tuple[dict[str, object], dict[str, str]]:
    """({section path: replacement model}, {dotted key: reason}) for cfg, an ExperimentConfig."""
    policy, sft, generation = cfg.policy, cfg.sft, cfg.policy.generation
    embedded = policy.model_name is None
    reasons: dict[str, str] = {}
    sft_updates = {}
    for key, value in EMBEDDED_SFT.items():
        if key not in sft.model_fields_set:
            sft_updates[key] = value if embedded else CHECKPOINT_SFT[key]
            reasons[f"sft.{key}"] = EMBEDDED if embedded else CHECKPOINT
    policy_updates, generation_updates = {}, {}
    total = policy.max_total_sequence_length
    if total is None:
        limit = context_length(policy.model_name)
        total = EMBEDDED_LENGTHS["max_total_sequence_length"] if embedded else min(limit or CHECKPOINT_MAX_LENGTH,
                                                                                  CHECKPOINT_MAX_LENGTH)
        policy_updates["max_total_sequence_length"] = total
        reasons["policy.max_total_sequence_length"] = EMBEDDED if embedded else "the model's context, at most 1024"
    if generation.max_new_tokens is None:
        generation_updates["max_new_tokens"] = EMBEDDED_LENGTHS["max_new_tokens"] if embedded else total // 2
        reasons["policy.generation.max_new_tokens"] = EMBEDDED if embedded else "half of max_total_sequence_length"
    if "max_model_len" not in generation.vllm_cfg.model_fields_set:
        generation_updates["vllm_cfg"] = generation.vllm_cfg.model_copy(update={"max_model_len": total})
        reasons["policy.generation.vllm_cfg.max_model_len"] = "policy.max_total_sequence_length"
    grpo_updates = {}
    if embedded and cfg.algorithm.uses_rollouts and not any(_is_set(cfg, key) for key in BATCH_KEYS):
        grpo_updates["num_prompts_per_step"] = EMBEDDED_PROMPTS_PER_STEP
        batch = EMBEDDED_PROMPTS_PER_STEP * cfg.grpo.num_generations_per_prompt
        policy_updates.update(train_global_batch_size=batch, train_micro_batch_size=batch // 2,
                              logprob_batch_size=batch // 2)
        reasons.update({key: EMBEDDED + " GRPO demo" for key in BATCH_KEYS})
    if embedded and cfg.algorithm.uses_rollouts and not _is_set(cfg, "grpo.max_num_steps"):
        grpo_updates["max_num_steps"] = EMBEDDED_GRPO_STEPS
        reasons["grpo.max_num_steps"] = EMBEDDED + " GRPO demo"
    replaced: dict[str, object] = {}
    if grpo_updates:
        replaced["grpo"] = cfg.grpo.model_copy(update=grpo_updates)
    if sft_updates:
        replaced["sft"] = sft.model_copy(update=sft_updates)
    if generation_updates:
        policy_updates["generation"] = generation.model_copy(update=generation_updates)
    if policy_updates:
        replaced["policy"] = policy.model_copy(update=policy_updates)
    if cfg.data.default_task is None:
        replaced["data"] = cfg.data.model_copy(update={"default_task": _default_task(cfg.env)})
        reasons["data.default_task"] = "the env's one task"
    return replaced, reasons


def _is_set(cfg, dotted: str) -> bool:
    section, key = dotted.split(".")
    return key in getattr(cfg, section).model_fields_set


def _default_task(env: dict) -> str:
    if len(env) != 1:
        raise ValueError(f"data.default_task is required with several env tasks ({', '.join(sorted(env))}): name "
                         "the task of the rows that name none (data.task_key)")
    return next(iter(env))


def check_length_keys(cfg) -> None:
    """New tokens leave room for a prompt; nothing exceeds the model's context. ValueError naming the keys."""
    policy, generation = cfg.policy, cfg.policy.generation
    total, new = policy.max_total_sequence_length, generation.max_new_tokens
    if new >= total:
        raise ValueError(f"policy.generation.max_new_tokens ({new}) leaves no room for a prompt in "
                         f"policy.max_total_sequence_length ({total}): lower the first or raise the second")
    engine = generation.vllm_cfg.max_model_len
    if generation.backend.separate_services and new >= engine:
        raise ValueError(f"policy.generation.max_new_tokens ({new}) leaves no room for a prompt in "
                         f"policy.generation.vllm_cfg.max_model_len ({engine}): lower the first or raise the second")
    limit = context_length(policy.model_name)
    if limit is not None:
        for key, value in (("policy.max_total_sequence_length", total),
                           ("policy.generation.vllm_cfg.max_model_len", engine)):
            if value > limit:
                raise ValueError(f"{key} ({value}) exceeds the model's context length ({limit}, "
                                 f"max_position_embeddings in {policy.model_name}/config.json): lower it")
