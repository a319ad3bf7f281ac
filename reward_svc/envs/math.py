"""Math scorer on math-verify, parsing as NeMo-RL's math environment (`hf_math_verify`) does:
the reference answer is wrapped in \\boxed{...} and read with LaTeX extraction only; the
completion is read with plain-expression and LaTeX extraction (in that order of preference);
the item is correct when any parse of the completion is equivalent to any parse of the
reference (math-verify's `verify`, 6 decimal places for floats).

A reference that yields nothing parseable raises ValueError (the engine logs it and scores
the item 0, as NeMo-RL scores it 0).

math-verify's own timeouts use SIGALRM, which only works on a process's main thread: this
runs inside the service's worker processes, never on a gRPC thread.
"""

from __future__ import annotations

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from reward_svc.types import ScoreResult

_GOLD_EXTRACTION = [LatexExtractionConfig()]
_ANSWER_EXTRACTION = [ExprExtractionConfig(), LatexExtractionConfig()]


def score(completion: str, ground_truth: str, timeout_s: int = 5) -> ScoreResult:
    gold = parse_ground_truth(ground_truth, timeout_s)
    answer = parse(completion, extraction_config=_ANSWER_EXTRACTION, parsing_timeout=timeout_s)
    correct = bool(answer) and bool(verify(gold, answer, timeout_seconds=timeout_s))
    return ScoreResult(reward=1.0 if correct else 0.0, correct=correct)


def parse_ground_truth(ground_truth: str, timeout_s: int = 5) -> list:
    """The reference answer's parses: the text as is (not stripped) inside \\boxed{}."""
    gold = parse("\\boxed{" + ground_truth + "}", extraction_config=_GOLD_EXTRACTION, parsing_timeout=timeout_s)
    if not gold:
        raise ValueError(f"ground truth {ground_truth!r} could not be parsed as math: give the answer as a "
                         "number or a LaTeX expression (it is read as \\boxed{<ground truth>})")
    return gold
