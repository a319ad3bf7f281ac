"""The drift guard stops a run whose generator serves other weights than the trainer's.

The cluster's own generator serves the trainer's checkpoint (the embedded tiny Llama, untied).
A second generator joins with a copy of that checkpoint whose config says
`tie_word_embeddings: true` (and which has no `lm_head.weight`): vLLM then skips every
`lm_head.weight` it is sent (a tied head is the embedding), so after any number of weight updates it samples from the embedding matrix as
output head while the trainer uses its own head. Loading raises nothing; only the logprobs say
so. With the default bound and grace, the second GRPO step must stop the run with the
documented message naming that generator, and not the other one.
"""

from __future__ import annotations

import json
import shutil

import pytest
import structlog
from safetensors.torch import load_file, save_file

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.launcher import ServiceSpec, python_module
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import generator_settings, scratch_root
from coordinator.loop.context import LoopContext
from coordinator.loop.drift import DriftError
from tests import procs

pytestmark = pytest.mark.integration


def _tied_copy(model_dir, out_dir):
    """The checkpoint with `tie_word_embeddings: true` and without `lm_head.weight` (vLLM would
    untie a config whose checkpoint still holds one)."""
    shutil.copytree(model_dir, out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (out_dir / "config.json").write_text(json.dumps(config))
    weights = out_dir / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["lm_head.weight"]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return out_dir


def _spawn_generator(cluster: LocalCluster, cfg, model_dir: str, name: str, known: str) -> str:
    """Start a generator serving `model_dir` into the running cluster; returns its member id."""
    settings = generator_settings(cfg, model_dir, 1, scratch_root(cluster.run_dir) / name)
    path = cluster.run_dir / "services" / f"{name}.json"
    path.write_text(settings.model_dump_json())
    cluster.launcher.start(ServiceSpec(name, python_module(
        "generator_svc", "--settings", str(path), "--host", cfg.cluster.host, "--coordinator", cluster.address),
        essential=False))
    members = cluster.registry.wait_for(lambda ms: sum(m.kind == "generator" for m in ms) >= 2, 300,
                                        check=cluster.launcher.check)
    return next(m.member_id for m in members if m.kind == "generator" and m.member_id != known)


def test_a_generator_serving_another_head_stops_the_run_naming_it(tmp_path):
    cfg = load_config(overrides=[
        "cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={tmp_path}",
        "logger.tensorboard_enabled=false", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=32", "policy.train_micro_batch_size=32"])  # default bound 1.05, grace 2
    model_dir = str(ensure_tiny_model(tmp_path / "cache"))
    foreign = str(_tied_copy(ensure_tiny_model(tmp_path / "cache"), tmp_path / "tied-copy"))
    train_path, _ = ensure_arithmetic_dataset(tmp_path / "cache", 0, 500, 16)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    cluster = LocalCluster(cfg, model_dir, run_dir, procs.TOKEN, log)
    with cluster as services:
        own = services.all_generators()[0].member_id
        drifted = _spawn_generator(cluster, cfg, foreign, "generator-foreign", own)
        tokens = Tokens(model_dir)
        ctx = LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log)
        first = grpo_step(ctx, 1)
        assert first["token_mult_prob_error"] > 1.05 and first["drift_steps_over_bound"] == 1, first
        with pytest.raises(DriftError) as stopped:
            grpo_step(ctx, 2)
    text = str(stopped.value)
    print(text)  # the documented message, for the log
    assert "generator/trainer mismatch: token_mult_prob_error was" in text
    assert "grpo.max_token_mult_prob_error=1.05 for 2 consecutive steps" in text
    assert "the samples came from weight version 0 onwards (step 1 to 2)" in text
    assert f"generator {drifted} (weight version 2) DRIFTED" in text
    assert f"generator {own} (weight version 2) agrees" in text
