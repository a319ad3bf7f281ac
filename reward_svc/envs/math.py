"""Math scorer on math-verify: the completion's final answer (\\boxed{}, a plain number or
LaTeX) must be mathematically equivalent to the reference answer.

math-verify's own timeouts use SIGALRM, which only works on a process's main thread: this
runs inside the service's worker processes, never on a gRPC thread.
"""

from __future__ import annotations

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from reward_svc.types import ScoreResult

_EXTRACTION = [LatexExtractionConfig(), ExprExtractionConfig()]


def score(completion: str, ground_truth: str, timeout_s: int = 5) -> ScoreResult:
    gold = parse(_as_latex(ground_truth), extraction_config=_EXTRACTION, parsing_timeout=timeout_s)
    if not gold:
        raise ValueError(f"ground truth {ground_truth!r} could not be parsed as math")
    answer = parse(completion, extraction_config=_EXTRACTION, parsing_timeout=timeout_s)
    correct = bool(answer) and bool(verify(gold, answer, timeout_seconds=timeout_s))
    return ScoreResult(reward=1.0 if correct else 0.0, correct=correct)


def _as_latex(text: str) -> str:
    """Wrap a bare reference answer in $...$ so LaTeX and plain forms both parse."""
    text = text.strip()
    return text if "$" in text or "\\boxed" in text else f"${text}$"
