"""policy.dtensor_cfg.custom_parallel_plan on real torchrun ranks (2 ranks, TP=2, gloo, CPU): a
plan given by dotted path (tests/plans.py, NeMo-RL's form, its head leaving the logits sharded
over the vocabulary) trains exactly like the built-in plan and like one rank."""

from __future__ import annotations

import pytest

from coordinator.embedded.tiny_model import ensure_tiny_model
from tests.integration.test_megatron_backend import run_worker

pytestmark = pytest.mark.integration


def test_custom_plan_trains_like_the_built_in_plan(tmp_path):
    model_dir = str(ensure_tiny_model(tmp_path / "models"))
    cache = tmp_path / "cache"
    one, _ = run_worker(tmp_path, {"model_name": model_dir}, "step2", 1, cache)
    custom, log = run_worker(tmp_path, {"model_name": model_dir, "dtensor_cfg": {
        "tensor_parallel_size": 2, "custom_parallel_plan": "tests.plans.llama_tp_plan"}}, "step2", 2, cache)
    for mine, ref in zip(custom["steps"], one["steps"]):
        for key in ("loss", "grad_norm", "kl", "entropy"):
            assert abs(mine[key] - ref[key]) < 1e-4, (key, mine, ref)
    for row, ref_row in zip(custom["logprobs"], one["logprobs"]):
        assert max(abs(a - b) for a, b in zip(row, ref_row)) < 1e-4
    _, log = run_worker(tmp_path, {"model_name": model_dir, "dtensor_cfg": {
        "tensor_parallel_size": 2, "custom_parallel_plan": "tests.plans.not_a_plan"}}, "step2", 2, cache, check=False)
    assert "custom_parallel_plan 'tests.plans.not_a_plan' is list, not a non-empty dict" in log
