"""Calculator tool for the arithmetic task: a multi-turn environment.

The protocol, small enough for a character-level model (whose vocabulary has digits,
`+-*/=().,?:!'"`, space, newline and letters, but no angle brackets):

- Each turn the model writes a completion, ended by EOS (or its token budget).
- A completion whose text ends with `?` (trailing whitespace ignored) calls the calculator.
  The expression is the completion's text before that `?`; when it is empty, it is the
  prompt's own expression: the digits, operators, parentheses and spaces just before the
  prompt's last `=`. So on the prompt `12+34=` (or `calc 12+34=`) the completion `?` asks for
  12+34 and the completion `12+34?` asks for it explicitly.
  The observation is the value and a newline (`46\\n`), or `error\\n` when the expression is
  not integers joined by `+`, `-`, `*` and parentheses (at most MAX_EXPRESSION_CHARS).
  A call earns nothing; the episode goes on.
- Any other completion is the final answer: the episode ends, scored like the `exact` scorer
  (its first line, stripped, must equal the reference answer): reward 1 if so, else 0.
- A call past `max_tool_calls` ends the episode with reward 0.

The token stream of a solved episode: `<s>12+34=` `?</s>` `46\\n` `46</s>`: the model's tokens
are `?</s>` and `46</s>`, the environment's `46\\n`.
"""

from __future__ import annotations

import ast
import re

from reward_svc.envs import exact
from reward_svc.types import ScoreResult, StepResult, Turn

MAX_EXPRESSION_CHARS = 64
_TRAILING_EXPRESSION = re.compile(r"[0-9+\-*() ]*$")
_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def evaluate(expression: str) -> int:
    """The value of integers joined by + - * and parentheses; ValueError otherwise. Bounded:
    at most MAX_EXPRESSION_CHARS characters and no power operator, so values stay small."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def prompt_expression(prompt: str) -> str:
    """The arithmetic just before the prompt's last `=` ('calc 12+34=' -> '12+34')."""
    before = prompt.rpartition("=")[0]
    return _TRAILING_EXPRESSION.search(before).group().strip()


def tool_request(completion: str) -> str | None:
    """The expression a completion asks for ('' for the prompt's own), or None for an answer."""
    text = completion.rstrip()
    return text[:-1].strip() if text.endswith("?") else None


def step(prompt: str, ground_truth: str, history: tuple[Turn, ...], completion: str,
         max_tool_calls: int) -> StepResult:
    """Respond to the latest completion of an episode (see the module docstring)."""
    request = tool_request(completion)
    if request is None:
        answer = exact.score(completion, ground_truth)
        return StepResult(done=True, reward=answer.reward, correct=answer.correct)
    calls = 1 + sum(tool_request(turn.completion) is not None for turn in history)
    if calls > max_tool_calls:
        return StepResult(done=True, reward=0.0, correct=False)
    expression = request or prompt_expression(prompt)
    try:
        observation = f"{evaluate(expression)}\n"
    except ValueError:
        observation = "error\n"
    return StepResult(done=False, observation=observation)


def score(completion: str, ground_truth: str) -> ScoreResult:
    """Single-turn scoring (Score, e.g. validation without the tool): the exact scorer."""
    return exact.score(completion, ground_truth)
