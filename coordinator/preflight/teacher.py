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
    teacher, student = vocabulary(teacher_dir), vocabulary(student_dir)
    if teacher != student:
        differ = sorted(t for t in teacher.keys() | student.keys() if teacher.get(t) != student.get(t))
        raise ConfigError(f"{KEY}: the teacher's tokenizer ({len(teacher)} tokens) is not the policy's ({len(student)} "
                          f"tokens): {len(differ)} tokens differ (e.g. {', '.join(repr(t) for t in differ[:3])}). The "
                          "teacher scores the student's token ids, so both need one vocabulary: pick a teacher of the "
                          "student's model family")
    return f"teacher {teacher_dir}: the policy's tokenizer ({len(teacher)} tokens)"


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


def vocabulary(model_dir: str | None) -> dict[str, int]:
    """Token -> id of `model_dir`'s tokenizer (None: the embedded model's)."""
    if model_dir is None:
        from coordinator.embedded.tiny_model import char_tokenizer

        return char_tokenizer().get_vocab(with_added_tokens=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).get_vocab()
