"""The one check of prompt lengths, made before anything starts: every prompt plus
`policy.generation.max_new_tokens` against what the generators take (vLLM's
`policy.generation.vllm_cfg.max_model_len`, or the trainer's `policy.max_total_sequence_length`
when the trainer generates) and what the trainer is set to take. A prompt the generators would
refuse is an error; prompts past policy.max_total_sequence_length are a warning, and an error
past data.max_truncated_fraction. (How the length keys relate to each other and to the model's
context is checked when the config loads: coordinator/config/defaults.py check_length_keys.)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.config import ConfigError, ExperimentConfig
from coordinator.data.examples import Example


@dataclass(frozen=True)
class LengthReport:
    """Prompts of one source measured against the run's limits."""

    source: str
    num_prompts: int
    refused: list[tuple[str, int]]
    """(prompt, tokens) of prompts the generators would refuse: prompt + max_new_tokens > their limit."""
    overflowing: int
    """Prompts whose prompt + max_new_tokens exceeds policy.max_total_sequence_length."""
    longest: int


def measure_prompts(cfg: ExperimentConfig, prompts: Sequence[tuple[str, int]], source: str) -> LengthReport:
    """`prompts`: (text, tokens) of each prompt of `source`."""
    budget, (hard, _) = cfg.policy.generation.max_new_tokens, cfg.policy.generation_limit
    refused = [(text, length) for text, length in prompts if length + budget > hard]
    overflowing = sum(length + budget > cfg.policy.max_total_sequence_length for _, length in prompts)
    return LengthReport(source, len(prompts), refused, overflowing, max((n for _, n in prompts), default=0))


def measure_examples(cfg: ExperimentConfig, examples: Sequence[Example], source: str) -> LengthReport:
    return measure_prompts(cfg, [(e.prompt, len(e.prompt_ids)) for e in examples], source)


def measure_embedded_task(cfg: ExperimentConfig) -> LengthReport:
    """The embedded model on the embedded task (every default run), without reading its files:
    every prompt is "ab+cd=" plus BOS, the longest "99+99=" plus BOS."""
    text, length, count = _embedded_prompts()
    return measure_prompts(cfg, [(text, length)] * count, "the embedded arithmetic task")


@functools.cache
def _embedded_prompts() -> tuple[str, int, int]:
    from coordinator.embedded.arithmetic import OPERAND_RANGE, all_operand_pairs

    text = f"{OPERAND_RANGE[-1]}+{OPERAND_RANGE[-1]}="
    return text, len(text) + 1, len(all_operand_pairs())


def check_lengths(cfg: ExperimentConfig, report: LengthReport) -> str | None:
    """ConfigError for prompts the generators would refuse, or too many past
    policy.max_total_sequence_length; the warning to show for fewer (None: all fit)."""
    budget, (_, limit_key) = cfg.policy.generation.max_new_tokens, cfg.policy.generation_limit
    if report.refused:
        prompt, length = report.refused[0]
        raise ConfigError(f"{report.source}: {len(report.refused)} of {report.num_prompts} prompts are too long for "
                          f"the generators: prompt + policy.generation.max_new_tokens ({budget}) exceeds {limit_key}; "
                          f"e.g. {prompt[:60]!r} has {length} tokens. Raise {limit_key} (to at least "
                          f"{report.longest + budget}), lower max_new_tokens, or drop the long rows")
    if not report.overflowing:
        return None
    fraction = report.overflowing / report.num_prompts
    limit = cfg.policy.max_total_sequence_length
    message = (f"{report.source}: {report.overflowing} of {report.num_prompts} prompts ({fraction:.0%}) plus "
               f"policy.generation.max_new_tokens ({budget}) exceed policy.max_total_sequence_length ({limit}), the "
               "longest prompt + completion the trainer is set to take (a multi-turn episode ends where its next "
               "turn would pass it). Raise "
               f"policy.max_total_sequence_length to at least {report.longest + budget}")
    if fraction > cfg.data.max_truncated_fraction:
        raise ConfigError(f"{message} (more than data.max_truncated_fraction={cfg.data.max_truncated_fraction} of "
                          "the prompts: the run would not start)")
    return message
