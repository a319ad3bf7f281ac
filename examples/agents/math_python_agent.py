"""A math agent with a Python tool: the model writes code, the code runs in Tandem's sandbox
(reward_svc/sandbox: its own namespaces, no network, an unprivileged uid, rlimits, seccomp), the
output goes back as the tool's message, and the model's final answer is rewarded. Written against
the OpenAI client; only the tool's runner is Tandem's.

Recipe: examples/configs/agent_math_python.yaml (PYTHONPATH=examples/agents, as for
calc_agent.py). The agent runs in the task's environment service (reward_svc/agents.py), so the
tool's code runs in that service's sandbox, which needs root (CAP_SYS_ADMIN) there; without it the
tool fails and each episode ends counted as agent/ended_error. tests/integration/test_agent_gateway.py
trains this agent for two GRPO steps on the tiny chat model.
"""

from __future__ import annotations

import asyncio
import json
import signal

from reward_svc.config import SandboxLimits
from reward_svc.sandbox import run_program

TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python code (a notebook cell: the value of a last expression is printed)",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
MAX_TURNS = 3
"""Model calls per episode: a tool call, its result, the answer (one more call for a retry)."""
TOOL_OUTPUT_CHARS = 48
"""What of the tool's output goes back (its end: the value, or an error's last line)."""
LIMITS = SandboxLimits(cpu_s=1, wall_s=2.0)

CELL = """\
import ast
source = open(3).read()
tree = ast.parse(source)
last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
scope = {"__name__": "__main__"}
exec(compile(tree, "<cell>", "exec"), scope)
if last is not None:
    value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), scope)
    if value is not None:
        print(repr(value))
"""


async def run_python(code: str) -> str:
    """Run `code` as a notebook cell in the sandbox; its output (the end of it), or why it had none."""
    result = await asyncio.to_thread(run_program, CELL, LIMITS, input_text=code)
    if result.setup_error:
        raise RuntimeError(f"the Python tool's sandbox could not start: {result.setup_error}")
    if result.timed_out or result.exit_code in (-signal.SIGXCPU, -signal.SIGKILL):  # wall clock or CPU limit
        return f"timed out (limits: {LIMITS.cpu_s} s of CPU, {LIMITS.wall_s} s of wall clock)"
    lines = result.output.strip().splitlines()
    return (lines[-1] if lines else "(no output)")[-TOOL_OUTPUT_CHARS:]


async def episode(example: dict, client) -> tuple[float, dict]:
    """example: {"prompt": "12+34=", "answer": "46", ...}; client: openai.AsyncOpenAI."""
    messages = [{"role": "user", "content": example["prompt"].rstrip("=")}]
    answer, tool_runs = "", []
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = (message.content or "").strip()
            break
        for call in message.tool_calls:
            code = json.loads(call.function.arguments or "{}").get("code", "")
            output = await run_python(code) if call.function.name == "python" else f"no tool {call.function.name}"
            if call.function.name == "python":
                tool_runs.append([code, output])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return float(answer == example["answer"]), {"tool_runs": tool_runs}  # [code, output] of each run
