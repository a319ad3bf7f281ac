"""LLM-as-judge: a reward that asks a model to score an answer and parses the score from its reply.

The judge is called through the rollout gateway with the episode's own client, as a side call
(`extra_body={"tandem": {"record": False}}`): a generator samples it like any call, but its tokens
are not part of the episode, so the policy is never trained on the judge's words (the gateway:
coordinator/loop/gateway/service.py).
The judge is then the policy itself; a separate judge model is a gateway of its own (base_url).

A reply without a score in range raises `UnparsableJudgement` (the environment service counts it as
agent/ended_judge_unparsable; an agent may catch it and give its own reward instead).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

DEFAULT_TEMPLATE = (
    "Rate how well the answer answers the question, from 0 (wrong) to {max_score} (fully right), "
    "using the reference answer.\nQuestion: {question}\nAnswer: {answer}\nReference: {reference}\n"
    "Reply with one line: Score: <number>")
FIELDS = frozenset({"question", "answer", "reference", "max_score"})
SIDE_CALL = {"tandem": {"record": False}}
"""The request's extra body of a call the gateway serves without recording it in the episode."""

_SCORE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*\d+(?:\.\d+)?)?", re.IGNORECASE)
_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*\d+(?:\.\d+)?)?\s*\.?\s*")


class UnparsableJudgement(ValueError):
    """The judge's reply holds no score in range; `reply` is what it wrote."""

    def __init__(self, message: str, reply: str):
        super().__init__(message)
        self.reply = reply


def parse_score(reply: str, max_score: float) -> float:
    """The score in `reply`, scaled to [0, 1]: the last `Score: n` (or `score = n`, `Score: n/10`),
    else a reply that is only a number. UnparsableJudgement when there is none or it is outside
    0..max_score."""
    found = _SCORE.findall(reply)
    if found:
        value = float(found[-1])
    else:
        bare = _NUMBER.fullmatch(reply)
        if bare is None:
            raise UnparsableJudgement(f"the judge's reply has no score (expected 'Score: <0-{max_score:g}>'): "
                                      f"{reply[:120]!r}", reply)
        value = float(bare.group(1))
    if not 0 <= value <= max_score:
        raise UnparsableJudgement(f"the judge's score {value:g} is outside 0..{max_score:g}: {reply[:120]!r}", reply)
    return value / max_score


@dataclass(frozen=True)
class Judge:
    template: str = DEFAULT_TEMPLATE
    """The judge's user message; placeholders {question}, {answer}, {reference}, {max_score}."""
    max_score: float = 10.0
    max_tokens: int = 32
    """The judge's reply length (a score line)."""
    temperature: float = 0.0
    model: str = "policy"

    def __post_init__(self) -> None:
        if self.max_score <= 0:
            raise ValueError(f"Judge.max_score must be > 0; got {self.max_score}")
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
        except ValueError as exc:
            raise ValueError(f"Judge.template is not a format string ({exc}); write literal braces as {{{{ }}}}") \
                from None
        unknown = fields - FIELDS
        if unknown:
            raise ValueError(f"Judge.template has unknown placeholders {sorted(unknown)}; use {sorted(FIELDS)}")
        if "answer" not in fields:
            raise ValueError("Judge.template must show the judge the answer: add {answer}")

    def prompt(self, question: str, answer: str, reference: str = "") -> str:
        return self.template.format(question=question, answer=answer, reference=reference,
                                    max_score=f"{self.max_score:g}")

    async def score(self, client, question: str, answer: str, reference: str = "") -> float:
        """Ask the judge through `client` (an openai.AsyncOpenAI on the gateway) as a side call;
        the parsed score in [0, 1] (UnparsableJudgement when there is none)."""
        reply = await client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": self.prompt(question, answer, reference)}],
            max_tokens=self.max_tokens, temperature=self.temperature, extra_body=SIDE_CALL)
        return parse_score(reply.choices[0].message.content or "", self.max_score)
