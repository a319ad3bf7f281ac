"""A multi-turn text game: the model finds a secret digit with a `guess` tool whose observations
(higher, lower, correct) come back as tool messages; the fewer guesses, the higher the reward.
Written against the OpenAI client, nothing of Tandem in it.

Recipe: examples/configs/agent_guess_game.yaml (PYTHONPATH=examples/agents). The secret is the
last digit of the example's answer (any task's rows will do). tests/integration/
test_agent_gateway.py runs it for two GRPO steps on the tiny chat model.
"""

from __future__ import annotations

import json

TOOLS = [{"type": "function", "function": {
    "name": "guess", "description": "Guess the secret digit; the reply says higher, lower or correct",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                   "required": ["n"]}}}]
TASK = "Guess my number, 0-9."
MAX_GUESSES = 3


def observe(name: str, arguments: str, secret: int) -> str:
    """The game's answer to one tool call."""
    if name != "guess":
        return f"no tool {name}; use guess"
    n = json.loads(arguments or "{}").get("n")
    if not isinstance(n, int) or not 0 <= n <= 9:
        return "n must be a digit, 0-9"
    return "correct" if n == secret else "higher" if n < secret else "lower"


async def episode(example: dict, client) -> tuple[float, dict]:
    """example: {"answer": ..., ...}; client: openai.AsyncOpenAI. Reward 1, 0.7, 0.4 for a find at
    the first, second, third guess; 0 if not found (or the model stops calling the tool)."""
    secret = int(str(example["answer"])[-1])
    messages = [{"role": "user", "content": TASK}]
    for guesses in range(1, MAX_GUESSES + 1):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        first, *rest = message.tool_calls
        observation = observe(first.function.name, first.function.arguments, secret)
        messages.append({"role": "tool", "tool_call_id": first.id, "content": observation})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "one guess per turn"} for c in rest]
        if observation == "correct":
            return 1.0 - 0.3 * (guesses - 1), {"correct": True, "guesses": guesses}
    return 0.0, {"correct": False}
