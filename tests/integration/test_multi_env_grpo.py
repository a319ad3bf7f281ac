"""Two environments in one run on real processes (LocalCluster: 1 trainer rank, 1 vLLM
generator, one reward service per task): the arithmetic task scored by exact answer and the
same task with a calculator tool (multi-turn). Then the calculator's reward service is
swapped mid-run, and later killed and restarted while a step waits for it.

The calculator rows' prompts read `calc 12+34=`; a short SFT teaches the tiny model to call
the tool (`?`) on them, so GRPO episodes really take several turns."""

import math
import os
import signal
import threading
import time
from dataclasses import replace

import pytest
import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.config import load_config
from coordinator.data.examples import PromptCursor, read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import make_arithmetic_splits, write_jsonl
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.local import LocalCluster
from coordinator.loop.context import LoopContext
from coordinator.loop.rollouts import collect_episodes
from tandem.generation.types import SamplingConfig
from tests import procs

pytestmark = pytest.mark.integration


def _rows():
    train, _ = make_arithmetic_splits(seed=0, num_train=400, num_val=0)
    for i, row in enumerate(train):
        if i % 2:
            row.update(prompt=f"calc {row['prompt']}", task="calc")
    return train


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    root = tmp_path_factory.mktemp("multienv")
    train_path = write_jsonl(root / "train.jsonl", _rows())
    cfg = load_config(raw={"env": {"arithmetic": {"scorer": "exact"}, "calc": {"scorer": "calculator", "max_turns": 3}}},
                      overrides=["cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={root}",
                                 "logger.tensorboard_enabled=false", "data.dataset_name=jsonl",
                                 "data.default_task=arithmetic",
                                 f"data.train_path={train_path}", "grpo.num_prompts_per_step=8",
                                 "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=32",
                                 "policy.train_micro_batch_size=32"])
    model_dir = str(ensure_tiny_model(root / "cache"))
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    cluster = LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log)
    with cluster as services:
        tokens = Tokens(model_dir)
        examples = read_examples(train_path, cfg.data, tokens)
        # SFT: "calc ..." -> "?" (call the tool), plain prompts -> their answer
        warm = [replace(e, answer="?" if e.task == "calc" else e.answer) for e in examples]
        ctx = LoopContext.connect(cfg, services, tokens, warm, 0, log)
        for _ in range(3):
            sft_steps(ctx, 20)
        ctx.publish()
        ctx.cursor = PromptCursor(examples, 1)
        yield ctx, cluster, root
        for service in getattr(cluster, "test_services", []):
            service.stop()


def test_calculator_episodes_take_several_turns_on_real_services(loop):
    ctx, _, _ = loop
    batch = [e for e in ctx.cursor._examples if e.task == "calc"][:8]
    prompts = [list(e.prompt_ids) for e in batch]
    groups = collect_episodes(ctx, batch, prompts, SamplingConfig(n=4, temperature=1.0, max_tokens=4, seed=3))
    multi = [(e, ex) for group, ex in zip(groups, batch) for e in group if e.num_turns >= 2]
    assert len(multi) >= 8, [e.num_turns for g in groups for e in g]
    plain_calls = 0
    for episode, example in multi:
        assert len(episode.token_ids) == len(episode.logprobs) == len(episode.loss_mask)
        assert episode.loss_mask[-1] == 1.0  # an episode ends on a model turn
        first_turn = episode.loss_mask.index(0.0)
        if ctx.tokens.decode(episode.token_ids[:first_turn]) == "?":  # asks for the prompt's own sum
            observation = [t for t, m in zip(episode.token_ids, episode.loss_mask) if m == 0]
            assert ctx.tokens.decode(observation).startswith(f"{example.answer}\n")
            plain_calls += 1
    assert plain_calls >= 4


def test_mixed_grpo_steps_log_per_task_rewards(loop):
    ctx, _, _ = loop
    for step in range(1, 3):
        metrics = grpo_step(ctx, step)
        assert metrics["num_samples"] == 32
        for task in ("arithmetic", "calc"):
            assert 0.0 <= metrics[f"reward_mean/{task}"] <= 1.0
            assert f"accuracy_train/{task}" in metrics
        assert metrics["turns_mean/arithmetic"] == 1.0 and metrics["turns_mean/calc"] > 1.0
        # observation tokens carry placeholder logprobs: masked out, they leave the on-policy error at 1
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])


def _start_calc_service(ctx, cluster, root, name):
    settings = root / f"{name}.json"
    settings.write_text('{"tasks": {"calc": "calculator"}}')
    service = procs.start(procs.python_module("reward_svc", "--settings", str(settings), "--coordinator",
                                              cluster.address), root, name)
    cluster.test_services = [*getattr(cluster, "test_services", []), service]
    return service


def _calc_addresses(cluster):
    return sorted(m.address for m in cluster.registry.live("reward") if "calc" in m.tasks)


def test_swapping_the_calculator_service_mid_run(loop):
    ctx, cluster, root = loop
    old = _calc_addresses(cluster)
    new = _start_calc_service(ctx, cluster, root, "reward-calc-new")
    deadline = time.monotonic() + 30
    while new.address not in _calc_addresses(cluster):
        assert time.monotonic() < deadline, "the new service did not register"
        time.sleep(0.2)
    os.killpg(cluster.launcher.pids()["reward-calc"], signal.SIGTERM)  # stop the old one (it deregisters)
    metrics = grpo_step(ctx, 3)
    assert metrics["turns_mean/calc"] > 1.0 and metrics["num_samples"] == 32
    assert _calc_addresses(cluster) == [new.address] and old != [new.address]
    cluster.launcher.check()  # a reward service leaving is not a dead run

    # the new one dies without a word; another comes up a few seconds later: the step waits, retries, completes
    os.killpg(new.process.pid, signal.SIGKILL)
    later = {}
    starter = threading.Timer(3.0, lambda: later.update(service=_start_calc_service(ctx, cluster, root, "reward-calc-3")))
    starter.start()
    started = time.monotonic()
    metrics = grpo_step(ctx, 4)
    starter.join()
    assert metrics["num_samples"] == 32 and time.monotonic() - started > 3.0
    assert _calc_addresses(cluster) == [later["service"].address]
