import multiprocessing as mp

import pytest
import torch

from tandem.weight_sync import (GroupSpec, WeightReceiver, WeightSender, iter_plan_tensors, make_bucket_plan,
                                plan_for_state_dict)


def test_bucket_plan_packs_in_order_and_aligns():
    plan = make_bucket_plan([("a", (10,), torch.float32), ("b", (3,), torch.float64), ("c", (100,), torch.float32),
                             ("d", (1,), torch.int64)], bucket_bytes=256)
    a, b, c, d = plan.tensors
    assert (a.bucket_index, a.offset_bytes, a.size_bytes) == (0, 0, 40)
    assert (b.bucket_index, b.offset_bytes) == (0, 64)  # aligned
    assert (c.bucket_index, c.offset_bytes, c.size_bytes) == (1, 0, 400)  # larger than a bucket: its own
    assert (d.bucket_index, d.offset_bytes) == (2, 0)
    assert plan.bucket_sizes_bytes == (128, 448, 64)
    assert plan.digest() != make_bucket_plan([("a", (11,), torch.float32)]).digest()


def test_bucket_plan_rejects_bad_size():
    with pytest.raises(ValueError, match="bucket_bytes"):
        make_bucket_plan([], bucket_bytes=0)


def _receive(address, rank, plan, versions, queue):
    receiver = WeightReceiver()
    for version in versions:
        group = GroupSpec(address, 0, "secret", 3, op_timeout_s=20)
        state = receiver.receive(group, rank, version, plan)
        # numpy arrays travel by value: a tensor would pass by a file descriptor that dies with this process
        queue.put((rank, version, {k: v.numpy().copy() for k, v in state.items()}))
    receiver.close()


def _bad_version(address, plan, queue):
    try:
        WeightReceiver().receive(GroupSpec(address, 1, "other", 2, op_timeout_s=30), 1, 99, plan)
        queue.put("no error")
    except ConnectionError as exc:
        queue.put(str(exc))


def test_broadcast_to_two_receivers_between_processes():
    state = {"w": torch.randn(33, 7), "b": torch.randn(5).double(), "i": torch.arange(4)}
    plan = plan_for_state_dict(state, bucket_bytes=512)
    sender = WeightSender()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_receive, args=(sender.address, rank, plan, (1, 2), queue)) for rank in (1, 2)]
    for p in procs:
        p.start()
    try:
        for version in (1, 2):
            group = GroupSpec(sender.address, 0, "secret", 3, op_timeout_s=20)
            assert sender.send(group, version, plan, iter_plan_tensors(plan, state)) == plan.total_bytes
        got = [queue.get(timeout=60) for _ in range(4)]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert sorted((r, v) for r, v, _ in got) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for _, _, received in got:
        assert received.keys() == state.keys()
        for name, tensor in state.items():
            assert torch.equal(torch.from_numpy(received[name]), tensor), name


def test_receiver_refuses_a_transfer_that_is_not_the_announced_one():
    state = {"w": torch.ones(4)}
    plan = plan_for_state_dict(state)
    sender = WeightSender()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_bad_version, args=(sender.address, plan, queue))
    proc.start()
    group = GroupSpec(sender.address, 1, "other", 2, op_timeout_s=30)  # generous: formation under load
    with pytest.raises(Exception):
        sender.send(group, 1, plan, iter_plan_tensors(plan, state))  # receiver expects v99 and leaves
    message = queue.get(timeout=60)
    proc.join(timeout=30)
    assert "does not match the announced" in message


def test_sender_checks_tensors_against_plan():
    plan = plan_for_state_dict({"w": torch.ones(4)})
    sender = WeightSender()
    with pytest.raises(ValueError, match="shape"):
        from tandem.weight_sync import _group_by_bucket
        _group_by_bucket(plan, [("w", torch.ones(5))])
    with pytest.raises(ValueError, match="not given"):
        from tandem.weight_sync import _group_by_bucket
        _group_by_bucket(plan, [])
    sender.close()


def test_gloo_binds_the_interface_that_reaches_the_store():
    from tandem.weight_sync import _local_interface_for

    assert _local_interface_for("localhost") == "127.0.0.1"
    assert _local_interface_for("127.0.0.2") == "127.0.0.1"  # the route to any loopback address is lo
