"""The weight-sync group over NCCL (two GPUs: NCCL refuses two ranks on one device): the bytes
are there when send/receive return, the receiver's device holds two buckets at most (the version
is staged in pinned host memory), and a receiver that dies mid-transfer costs the sender an
exception within op_timeout_s, after which a new epoch works (tandem/weight_group.py)."""

import multiprocessing as mp
import os
import time

import pytest
import torch

from tandem.weight_sync import (
    GroupSpec,
    WeightReceiver,
    WeightSender,
    iter_plan_tensors,
    plan_block_views,
    plan_for_state_dict,
)

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

BUCKET = 4 << 20
WINDOW = 2 * BUCKET  # the checksums of two buckets in one broadcast, as the trainer groups them (64 MiB)


def _state():
    gen = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(512, 1024, generator=gen, dtype=torch.float32) for i in range(12)}


def _receive(address, epoch, die, queue):
    torch.cuda.set_device(1)
    plan = plan_for_state_dict(_state(), bucket_bytes=BUCKET, checksum_window_bytes=WINDOW)
    receiver = WeightReceiver(device=torch.device("cuda", 1), stage_device=torch.device("cpu"))
    if die:  # join the group, take the header, then vanish mid-transfer
        from tandem import weight_sync

        real = weight_sync.receive_buckets

        def dying(*args, **kwargs):
            for item in real(*args, **kwargs):
                os._exit(1)
                yield item
        weight_sync.receive_buckets = dying
    torch.cuda.reset_peak_memory_stats(1)
    base = torch.cuda.memory_allocated(1)
    staged = receiver.receive(GroupSpec(address, epoch, "e", 2, op_timeout_s=15), 1, epoch, plan)
    peak = torch.cuda.max_memory_allocated(1) - base
    queue.put((peak, {n: (t.device.type, t.is_pinned(), t.numpy().copy()) for n, t in staged.items()}))


def _run_receiver(ctx, address, epoch, die, queue):
    proc = ctx.Process(target=_receive, args=(address, epoch, die, queue))
    proc.start()
    return proc


@pytest.mark.parametrize("layout", ["tensors", "block"])
def test_nccl_transfer_is_complete_on_return_and_bounded_on_the_receiver_device(layout):
    """`block`: the sender's tensors are views of one block laid out as the plan, as a one-GPU
    trainer keeps its parameters (trainer_svc/publish.py): every bucket goes from that memory."""
    torch.cuda.set_device(0)
    state = _state()
    plan = plan_for_state_dict(state, bucket_bytes=BUCKET, checksum_window_bytes=WINDOW)
    sender = WeightSender(device=torch.device("cuda", 0))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = _run_receiver(ctx, sender.address, 1, False, queue)
    try:
        on_device = {n: t.cuda() for n, t in state.items()}
        if layout == "block":
            _, views = plan_block_views(plan, torch.device("cuda", 0))
            on_device = {n: views[n].copy_(t) for n, t in on_device.items()}
        assert sender.send(GroupSpec(sender.address, 1, "e", 2, op_timeout_s=15), 1, plan,
                           iter_plan_tensors(plan, on_device)) == plan.total_bytes
        peak, staged = queue.get(timeout=120)
    finally:
        proc.join(timeout=60)
        sender.close()
    assert peak <= 2 * max(plan.bucket_sizes_bytes) + (1 << 20), peak  # two buffers, not the model
    assert plan.total_bytes > 4 * max(plan.bucket_sizes_bytes)
    for name, tensor in state.items():
        device, pinned, value = staged[name]
        assert device == "cpu" and pinned
        assert torch.equal(torch.from_numpy(value), tensor), name


def test_a_receiver_dying_mid_publish_raises_in_the_sender_which_goes_on_with_a_new_epoch():
    torch.cuda.set_device(0)
    state = {n: t.cuda() for n, t in _state().items()}
    plan = plan_for_state_dict(state, bucket_bytes=BUCKET, checksum_window_bytes=WINDOW)
    sender = WeightSender(device=torch.device("cuda", 0))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    dying = _run_receiver(ctx, sender.address, 1, True, queue)
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - NCCL's error type varies; the point is it is raised here
        sender.send(GroupSpec(sender.address, 1, "e", 2, op_timeout_s=15), 1, plan, iter_plan_tensors(plan, state))
    assert time.monotonic() - started < 15 * 3
    dying.join(timeout=30)
    proc = _run_receiver(ctx, sender.address, 2, False, queue)
    try:
        assert sender.send(GroupSpec(sender.address, 2, "e", 2, op_timeout_s=15), 2, plan,
                           iter_plan_tensors(plan, state)) == plan.total_bytes
        queue.get(timeout=120)
    finally:
        proc.join(timeout=60)
        sender.close()
