"""Context parallelism's data layout (trainer_svc/context_parallel.py) on 2 real gloo processes:
split + gather returns the sequence, and a loss computed from the gathered per-token values,
scaled by 1/cp and summed over the CP ranks (as the data-parallel gradient sum does), gives the
gradient of the whole sequence's loss on one process."""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer_svc import context_parallel as cp

SEQ = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 8) / 10


def _weighted_loss(per_token: torch.Tensor) -> torch.Tensor:
    return (per_token * torch.linspace(0.5, 2.0, per_token.shape[1])).square().sum()


def _rank(rank: int, store_path: str, out: dict) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    weight = torch.tensor(1.5, requires_grad=True)
    local = cp.split(SEQ, 2, rank) * weight  # "the model" on this rank's tokens
    full = cp.gather(local, 2, None)
    (_weighted_loss(full) * cp.loss_scale(2)).backward()
    grad = weight.grad.clone()
    dist.all_reduce(grad)  # the data-parallel sum over CP ranks
    out[rank] = (full.detach(), grad.item(), cp.split(SEQ, 2, rank).tolist())
    dist.destroy_process_group()


def test_split_gather_and_the_gradient_of_the_whole_sequence():
    assert cp.split(SEQ, 2, 1).tolist() == torch.cat([SEQ[:, 2:4], SEQ[:, 4:6]], dim=1).tolist()
    assert torch.equal(cp.unsplit([cp.split(SEQ, 4, r) for r in range(4)]), SEQ)
    assert cp.labels(torch.tensor([[1, 2, 3]]), 0).tolist() == [[2, 3, 0]]
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        out = manager.dict()
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), out), nprocs=2, join=True)
        results = dict(out)
    weight = torch.tensor(1.5, requires_grad=True)
    _weighted_loss(SEQ * weight).backward()
    for rank in (0, 1):
        full, grad, _ = results[rank]
        assert torch.allclose(full, SEQ * 1.5)
        assert abs(grad - weight.grad.item()) < 1e-4 * abs(weight.grad.item())
