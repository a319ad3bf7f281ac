"""The DTensor backend's AdamW is the fused implementation (one kernel per parameter, no
model-sized temporaries); it trains as the foreach one did, within fp32 rounding."""

import pytest
import torch

from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.backends.dtensor.parallel import full_value
from trainer_svc.config import TrainerSettings
from trainer_svc.types import GrpoLossConfig, Sample


def test_fused_adamw_trains_as_foreach_did(world_of_one):
    samples = [Sample([1, 10 + i, 12, 5, 20 + i, 30, 7 + i], 4, generation_logprobs=[-3.0, -3.1, -2.9],
                      advantage=(-1.0) ** i * (1 + 0.1 * i)) for i in range(8)]
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.05)
    runs = {}
    for name in ("fused", "foreach"):
        backend = DTensorBackend(TrainerSettings(model_name=str(ensure_tiny_model(cache_root())), seed=0), world_of_one)
        groups = backend._optimizer.param_groups
        assert all(g["fused"] and not g["foreach"] for g in groups)
        if name == "foreach":
            for g in groups:
                g["fused"], g["foreach"] = False, True
        metrics = [backend.train_step(samples, loss, 8, 4, 1e-3).metrics for _ in range(3)]
        runs[name] = (metrics, [full_value(p).clone() for p in backend._params])
        backend.close()
    (fused_metrics, fused_weights), (foreach_metrics, foreach_weights) = runs["fused"], runs["foreach"]
    for a, b in zip(fused_metrics, foreach_metrics):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for a, b in zip(fused_weights, foreach_weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert fused_metrics[-1]["loss"] != fused_metrics[0]["loss"]  # the steps did move the weights
