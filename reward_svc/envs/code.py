"""Code scorer: run the completion's Python against the item's tests in the sandbox; the
reward is the fraction of tests that pass.

Ground truth: a JSON object (as a string)

    {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "entry_point": "add"}

`tests` (non-empty list of Python snippets) run one by one, in order; a test passes when it
runs without raising. They see the names the completion's code defined at top level (its
functions and classes run in the completion's own process, see below). `entry_point`
(optional) names the function under test; when the completion defines it, tests may also
call it as `candidate`. A test that loops forever runs into the sandbox's wall clock: tests
that passed before it still count.

The code is the last ```python (or ```py) fenced block of the completion, else its last
fenced block of any language, else the whole completion.

What the completion cannot do is listed in reward_svc/sandbox/__init__.py. Nor can it fool
its tests from inside the interpreter: the tests run in a process of their own that the
completion's code never runs in (reward_svc/envs/code_harness.py), and what its functions
return crosses to them as plain data, so an object whose __eq__ is always true, patched
builtins, math, operator or json, an early exit or a forged report line score 0. What it
still can do is what any program can: special-case the inputs it is called with.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from reward_svc.config import SandboxLimits
from reward_svc.sandbox import SandboxResult, run_program
from reward_svc.types import ScoreResult

_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
MAX_TESTS = 256


class SandboxUnavailable(RuntimeError):
    """The sandbox could not be built (the program never ran)."""


@dataclass(frozen=True)
class CodeRun:
    """Outcome of one item: which of its tests passed, and the raw sandbox result.

    solution_exit: how the completion's process ended (exit code, or minus the signal that
    killed it); None when it was still running at the end (then stopped) or when the harness
    did not get that far (the sandbox's wall clock).
    """

    passed: frozenset[int]
    num_tests: int
    sandbox: SandboxResult
    solution_exit: int | None = None


def parse_ground_truth(ground_truth: str) -> tuple[list[str], str | None]:
    """(tests, entry_point) from the item's ground truth; ValueError says what is wrong."""
    try:
        spec = json.loads(ground_truth)
    except ValueError:
        raise ValueError('code ground truth must be JSON: {"tests": ["assert f(1) == 2", ...], '
                         '"entry_point": "f"}') from None
    if not isinstance(spec, dict) or set(spec) - {"tests", "entry_point"}:
        raise ValueError(f"code ground truth takes only the keys tests and entry_point, got {spec!r:.200}")
    tests, entry_point = spec.get("tests"), spec.get("entry_point")
    if not (isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
        raise ValueError("code ground truth: tests must be a non-empty list of strings")
    if len(tests) > MAX_TESTS:
        raise ValueError(f"code ground truth: at most {MAX_TESTS} tests per item, got {len(tests)}")
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError(f"code ground truth: entry_point must be a Python identifier, got {entry_point!r}")
    return tests, entry_point


def extract_code(completion: str) -> str:
    blocks = _FENCE.findall(completion)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else completion


def run_tests(completion: str, ground_truth: str, limits: SandboxLimits) -> CodeRun:
    tests, entry_point = parse_ground_truth(ground_truth)
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "code": extract_code(completion), "tests": tests, "entry_point": entry_point})
    result = run_program(_harness_source(), limits, input_text=job)
    if result.setup_error:
        raise SandboxUnavailable(result.setup_error)
    passed, solution_exit = set(), None
    for line in result.reports.decode(errors="replace").splitlines():
        token, _, index = line.partition(" ")
        if not secrets.compare_digest(token, nonce):
            continue
        if index.isdigit() and int(index) < len(tests):
            passed.add(int(index))
        elif index.startswith("exit ") and index[5:].lstrip("-").isdigit():
            solution_exit = int(index[5:])
    return CodeRun(passed=frozenset(passed), num_tests=len(tests), sandbox=result, solution_exit=solution_exit)


def score(completion: str, ground_truth: str, limits: SandboxLimits) -> ScoreResult:
    run = run_tests(completion, ground_truth, limits)
    return ScoreResult(reward=len(run.passed) / run.num_tests, correct=len(run.passed) == run.num_tests)


@cache
def _harness_source() -> str:
    return Path(__file__).with_name("code_harness.py").read_text()
