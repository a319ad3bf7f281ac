"""A one-rank float32 trainer runs its model without FSDP2 (trainer_svc/backends/dtensor/model.py
`needs_fsdp`): FSDP2 would shard nothing there, only copy every layer's parameters before each
forward and backward. It must train exactly as the FSDP2-wrapped model does: the same losses,
gradient norms, reference logprobs and weights, bit for bit, over steps with a KL reference."""

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy

import trainer_svc.backends.dtensor.model as model_module
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.backends.dtensor.model import needs_fsdp
from trainer_svc.backends.dtensor.parallel import full_value
from trainer_svc.config import TrainerSettings
from trainer_svc.types import GrpoLossConfig, Sample


def test_fsdp_only_where_it_does_something():
    assert not needs_fsdp(1, torch.float32, OffloadPolicy())
    assert needs_fsdp(2, torch.float32, OffloadPolicy())  # shards across ranks
    assert needs_fsdp(1, torch.bfloat16, OffloadPolicy())  # its mixed precision: float32 kept, bf16 computed
    assert needs_fsdp(1, torch.float32, CPUOffloadPolicy())


def test_the_plain_one_rank_model_trains_as_the_fsdp_wrapped_one(world_of_one, monkeypatch):
    samples = [Sample([1, 10 + i, 12, 5, 20 + i, 30, 7 + i], 4, generation_logprobs=[-3.0, -3.1, -2.9],
                      advantage=(-1.0) ** i * (1 + 0.1 * i)) for i in range(8)]
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.05)
    runs = {}
    for wrapped in (False, True):
        monkeypatch.setattr(model_module, "needs_fsdp", lambda *args, wrapped=wrapped: wrapped)
        backend = DTensorBackend(TrainerSettings(model_name=str(ensure_tiny_model(cache_root())), seed=0), world_of_one)
        assert any(isinstance(m, FSDPModule) for m in backend._model.modules()) == wrapped
        metrics = [backend.train_step(samples, loss, 8, 4, 1e-3).metrics for _ in range(3)]
        runs[wrapped] = (metrics, backend.compute_logprobs(samples, "reference", 4),
                         [full_value(p).clone() for p in backend._params])
        backend.close()
    (plain_metrics, plain_ref, plain_weights), (fsdp_metrics, fsdp_ref, fsdp_weights) = runs[False], runs[True]
    assert plain_metrics == fsdp_metrics and plain_ref == fsdp_ref
    assert plain_metrics[-1]["loss"] != plain_metrics[0]["loss"] and plain_metrics[-1]["kl"] > 0
    for a, b in zip(plain_weights, fsdp_weights):
        assert torch.equal(a, b)
