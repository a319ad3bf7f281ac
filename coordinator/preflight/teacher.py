"""A distillation teacher checked against its student before anything starts: its files
(model_files.py), its tokenizer (the teacher scores the student's token ids, so both must map
every token to the same id) and its engine's length (the longest prompt + completion the
student samples, plus the one token vLLM scores past it)."""

from __future__ import annotations

from coordinator.config import ConfigError, ExperimentConfig
from coordinator.preflight.model_files import check_model_dir

KEY = "distillation.teacher.model_name"


def check_teacher(cfg: ExperimentConfig, student_dir: str | None) -> str:
    """ConfigError naming what to change; what was checked, in words. student_dir: the policy's
    checkpoint (None: the embedded model, not built yet, whose tokenizer is built here)."""
    distillation = cfg.distillation
    assert distillation is not None and distillation.teacher.model_name is not None
    teacher_dir = distillation.teacher.model_name
    check_model_dir(teacher_dir, KEY)
    size = check_same_vocabulary(KEY, "teacher", teacher_dir, student_dir,
                                 "teacher scores the student's token ids, so both need one vocabulary: pick a "
                                 "teacher of the student's model family")
    return f"teacher {teacher_dir}: the policy's tokenizer ({size} tokens)"


def check_teacher_length(cfg: ExperimentConfig, longest_prompt: int) -> None:
    """ConfigError unless the longest prompt, its completion and vLLM's one more token fit the teacher's engine."""
    distillation = cfg.distillation
    assert distillation is not None
    limit = distillation.teacher_vllm(cfg.policy.generation.vllm_cfg).max_model_len
    need = longest_prompt + cfg.policy.generation.max_new_tokens + 1
    if need > limit:
        raise ConfigError(f"distillation.teacher.vllm_cfg.max_model_len ({limit}) cannot score the longest sequence "
                          f"the student may sample: its longest prompt ({longest_prompt} tokens) + "
                          f"policy.generation.max_new_tokens + 1 = {need}; raise it (within the teacher's context "
                          "length), lower max_new_tokens, or drop the longest rows")


def check_same_vocabulary(key: str, role: str, model_dir: str, policy_dir: str | None, why: str) -> int:
    """ConfigError at `key` unless `model_dir`'s tokenizer maps every token as the policy's does
    (`why`: what the other model does with the policy's ids, and what to change); its size."""
    theirs, policy = vocabulary(model_dir), vocabulary(policy_dir)
    if theirs != policy:
        differ = sorted(t for t in theirs.keys() | policy.keys() if theirs.get(t) != policy.get(t))
        raise ConfigError(f"{key}: the {role}'s tokenizer ({len(theirs)} tokens) is not the policy's ({len(policy)} "
                          f"tokens): {len(differ)} tokens differ (e.g. {', '.join(repr(t) for t in differ[:3])}). The "
                          f"{why}")
    return len(theirs)


def vocabulary(model_dir: str | None) -> dict[str, int]:
    """Token -> id of `model_dir`'s tokenizer (None: the embedded model's)."""
    if model_dir is None:
        from coordinator.embedded.tiny_model import char_tokenizer

        return char_tokenizer().get_vocab(with_added_tokens=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).get_vocab()
