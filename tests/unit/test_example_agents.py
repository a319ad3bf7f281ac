"""The example agents' own tools (examples/agents/): the math agent's Python tool runs code as a
notebook cell in the sandbox (reward_svc/sandbox), the game's tool answers guesses. Their episodes
through a real gateway run in tests/integration/test_agent_gateway.py."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"


@pytest.fixture(scope="module")
def agents():
    sys.path.insert(0, str(AGENTS))  # as PYTHONPATH=examples/agents puts them
    import guess_game_agent
    import math_python_agent
    yield math_python_agent, guess_game_agent
    sys.path.remove(str(AGENTS))


@pytest.mark.parametrize(("code", "output"), [
    ("12+34", "46"), ("x = 3\nx * 2", "6"), ("print('a')\nprint('b')", "b"), ("x = 1", "(no output)"),
    ("1/0", "ZeroDivisionError: division by zero"), ("12+", "SyntaxError: invalid syntax"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 1))", "Address family not supported by protocol")])
def test_the_python_tool_runs_a_cell_in_the_sandbox(agents, code, output):
    math_python_agent, _ = agents
    result = asyncio.run(math_python_agent.run_python(code))
    assert result == output if len(output) < 40 else result.endswith(output)  # the end of a long error line
    assert len(result) <= math_python_agent.TOOL_OUTPUT_CHARS


def test_the_python_tool_stops_a_cell_at_its_wall_clock(agents):
    math_python_agent, _ = agents
    assert asyncio.run(math_python_agent.run_python("while True: pass")).startswith("timed out")


def test_the_game_answers_a_guess_and_names_what_is_wrong(agents):
    _, game = agents
    assert [game.observe("guess", json.dumps({"n": n}), 6) for n in (5, 6, 7)] == ["higher", "correct", "lower"]
    assert game.observe("guess", json.dumps({"n": "5"}), 6) == "n must be a digit, 0-9"
    assert game.observe("calc", "{}", 6) == "no tool calc; use guess"
