"""An agent rewarded by an LLM judge: the policy answers, then a judge scores the answer against
the reference (reward_svc/envs/judge.py). The judge here is the policy itself, asked
through the same gateway as a side call, which samples it but never trains on it. For an answer
that a rule can check, a rule is cheaper and exact; a judge is for answers it cannot.

Recipe: examples/configs/agent_judge.yaml (PYTHONPATH=examples/agents). A judge reply without a
score ends the episode, counted as agent/ended_judge_unparsable. tests/integration/
test_agent_gateway.py runs it a GRPO step on the tiny chat model.
"""

from __future__ import annotations

from reward_svc.envs.judge import Judge

JUDGE = Judge(template="Question: {question}\nAnswer: {answer}\nReference: {reference}\nScore 0-{max_score}?",
              max_score=1, max_tokens=12)


async def episode(example: dict, client) -> tuple[float, dict]:
    """example: {"prompt", "answer", ...}; client: openai.AsyncOpenAI on the rollout gateway."""
    question = example["prompt"].rstrip("=")
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}],
                                                 max_tokens=16)
    answer = (reply.choices[0].message.content or "").strip()
    score = await JUDGE.score(client, question, answer, example["answer"])
    return score, {"correct": answer == example["answer"]}
