"""A tool-calling agent, written the way agents are written: against the OpenAI client, with
nothing of Tandem in it. Tandem runs it in the task's environment service (reward_svc/agents.py)
and trains it through its rollout gateway: every model call becomes tokens in one episode, exactly
as the generators sampled them (coordinator/loop/gateway/).

Run it (the module must import, where the run is configured and in the environment service: put
this directory on PYTHONPATH):

    PYTHONPATH=examples/agents tandem run my_experiment.yaml

with, in my_experiment.yaml,

    env:
      math:
        agent: {function: calc_agent.episode, timeout_s: 60, max_concurrency: 64}

The checkpoint needs a chat template that renders tools and Hermes `<tool_call>` blocks (Qwen2.5
and most instruct models do; the tests use coordinator/embedded/tiny_chat.py). The run's
integration test, tests/integration/test_agent_gateway.py, trains this agent for two GRPO steps.
"""

from __future__ import annotations

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "the value of the problem",
                                           "parameters": {"type": "object", "properties": {}}}}]


async def episode(example: dict, client) -> tuple[float, dict]:
    """Ask; run the tool calls the model makes (else ask once more); reward the final answer.

    example: {"prompt": "12+34=", "answer": "46", "task": ...}; client: openai.AsyncOpenAI."""
    question = example["prompt"].rstrip("=")
    messages = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=40)
    reply = first.choices[0].message
    messages.append(reply.model_dump(exclude_none=True))
    for call in reply.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": example["answer"]})
    if not reply.tool_calls:
        messages.append({"role": "user", "content": "again"})
    final = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=6)
    answer = (final.choices[0].message.content or "").strip()
    return float(answer == example["answer"]), {"tool_calls": len(reply.tool_calls or [])}
