import dataclasses
import multiprocessing as mp

import pytest
import torch

from tandem.weight_plan import checksum_window_ends
from tandem.weight_sync import (
    GroupSpec,
    WeightReceiver,
    WeightSender,
    iter_buckets,
    iter_plan_tensors,
    make_bucket_plan,
    plan_block_views,
    plan_for_state_dict,
    send_buffer_sizes,
)


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


def test_sender_buffers_fit_the_buckets_they_take():
    plan = make_bucket_plan([("a", (100,), torch.uint8), ("b", (40,), torch.uint8), ("c", (70,), torch.uint8)],
                            bucket_bytes=100)
    assert plan.bucket_sizes_bytes == (128, 64, 128)
    assert send_buffer_sizes(plan) == [128, 64]  # buckets 0 and 2 share the first, bucket 1 the second
    assert send_buffer_sizes(make_bucket_plan([("a", (10,), torch.uint8)])) == [64]


def test_checksum_windows_close_once_they_hold_enough_bytes():
    assert checksum_window_ends((10, 10, 10, 5), 20) == (2, 4)  # the last window short of 20 bytes
    assert checksum_window_ends((30, 10, 20), 20) == (1, 3)  # a bucket never splits
    assert checksum_window_ends((10, 10), 20) == (2,)
    assert checksum_window_ends((10, 10), None) == () and checksum_window_ends((), 20) == ()
    with pytest.raises(ValueError, match="must be positive"):
        checksum_window_ends((10,), 0)


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
    state = {"w": torch.randn(33, 7), "b": torch.randn(5).double(), "i": torch.arange(4), "u": torch.randn(60),
             "v": torch.randn(9, 9)}
    plan = plan_for_state_dict(state, bucket_bytes=512, checksum_window_bytes=600)
    assert 1 < len(plan.windows()) < len(plan.bucket_sizes_bytes)  # a window of several buckets, and several windows
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


def _tensors(shapes, held=None, drawn=None):
    """Fresh full tensors, one at a time (as a gathering export makes them), counted by `held`."""
    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes.items():
        tensor = torch.randn(shape, generator=gen)
        if held is not None:
            held.track(tensor)
        if drawn is not None:
            drawn.append(name)
        yield name, tensor
        del tensor  # not held while the next one is made


SHAPES = {"embed": (50, 16), "a": (16, 16), "b": (16,), "c": (64, 16), "d": (16, 16), "e": (3,), "head": (50, 16)}


def test_buckets_stream_out_holding_one_bucket_and_one_tensor():
    from trainer_svc.held_bytes import HeldBytes

    plan = make_bucket_plan(((n, s, torch.float32) for n, s in SHAPES.items()), bucket_bytes=2048)
    assert len(plan.bucket_sizes_bytes) >= 4
    held, drawn, received = HeldBytes(), [], {}
    expected = dict(_tensors(SHAPES))
    drawn_per_bucket = []
    for index, bucket in iter_buckets(plan, _tensors(SHAPES, held, drawn),
                                      lambda index, size: held.track(torch.empty(size, dtype=torch.uint8))):
        drawn_per_bucket.append(len(drawn))
        for spec in plan.tensors:
            if spec.bucket_index == index:
                raw = bucket[spec.offset_bytes:spec.offset_bytes + spec.size_bytes]
                received[spec.name] = raw.clone().view(torch.float32).view(spec.shape)
                del raw  # a view keeps the bucket alive
        del bucket
    assert list(received) == list(SHAPES)
    for name, tensor in expected.items():
        assert torch.equal(received[name], tensor), name
    # each bucket went out as soon as its tensors were there (nothing of the next one was drawn)
    ends = [max(i for i, t in enumerate(plan.tensors) if t.bucket_index == b) + 1
            for b in range(len(plan.bucket_sizes_bytes))]
    assert drawn_per_bucket == ends
    largest_tensor = max(t.size_bytes for t in plan.tensors)
    assert 0 < held.peak <= max(plan.bucket_sizes_bytes) + largest_tensor
    assert held.peak < plan.total_bytes
    assert held.current == 0


def _packing_into(packed: list[int]):
    def buffer_for(index: int, size: int) -> torch.Tensor:
        packed.append(index)
        return torch.empty(size, dtype=torch.uint8)
    return buffer_for


def _read(plan, buckets) -> dict[str, torch.Tensor]:
    return {s.name: buckets[s.bucket_index][s.offset_bytes:s.offset_bytes + s.size_bytes].view(torch.float32)
            .view(s.shape).clone() for s in plan.tensors}


def test_a_bucket_goes_from_a_block_only_while_every_tensor_lies_in_it_at_its_plan_offset():
    unmarked = make_bucket_plan(((n, s, torch.float32) for n, s in SHAPES.items()), bucket_bytes=2048)
    plan = dataclasses.replace(unmarked, in_block=True)
    several = [b for b in range(len(plan.bucket_sizes_bytes)) if sum(t.bucket_index == b for t in plan.tensors) > 1]
    assert several and plan.digest() == unmarked.digest()  # the mark is the sender's alone
    block, views = plan_block_views(plan)
    values = dict(_tensors(SHAPES))
    for name, tensor in values.items():
        views[name].copy_(tensor)
    packed: list[int] = []
    # a plan not marked in_block: buckets of several tensors are packed even from a block (the
    # tensors could be gathered views of larger buffers: not held beyond their turn)
    list(iter_buckets(unmarked, ((n, views[n]) for n in SHAPES), _packing_into(packed),
                      in_place_device=torch.device("cpu")))
    assert packed == several
    packed.clear()
    buckets = dict(iter_buckets(plan, ((n, views[n]) for n in SHAPES), _packing_into(packed),
                                in_place_device=torch.device("cpu")))
    assert packed == []  # every bucket is the block's own bytes
    start = block.data_ptr()
    assert [buckets[i].data_ptr() - start for i in sorted(buckets)] == [
        sum(plan.bucket_sizes_bytes[:i]) for i in range(len(plan.bucket_sizes_bytes))]
    assert all(torch.equal(got, values[n]) for n, got in _read(plan, buckets).items())

    # one tensor of a bucket elsewhere (a copy; or later in the block): that bucket is packed, bytes the same
    second = next(t for t in plan.tensors if t.offset_bytes > 0)
    moved = {**views, second.name: views[second.name].clone()}
    packed.clear()
    buckets = {i: b.clone() for i, b in iter_buckets(plan, ((n, moved[n]) for n in SHAPES), _packing_into(packed),
                                                      in_place_device=torch.device("cpu"))}
    assert packed == [second.bucket_index]
    assert all(torch.equal(got, values[n]) for n, got in _read(plan, buckets).items())
    first = next(t for t in plan.tensors if t.bucket_index == second.bucket_index)
    swapped = {**views, first.name: views[first.name].clone()}
    packed.clear()
    buckets = {i: b.clone() for i, b in iter_buckets(plan, ((n, swapped[n]) for n in SHAPES), _packing_into(packed),
                                                      in_place_device=torch.device("cpu"))}
    assert packed == [second.bucket_index]  # the first one elsewhere: the rest packed with it
    assert all(torch.equal(got, values[n]) for n, got in _read(plan, buckets).items())


def _reorder(items, order):
    items = list(items)
    return [items[i] for i in order]


@pytest.mark.parametrize("change, message", [
    (lambda items: [(n, t[:-1] if n == "d" else t) for n, t in items], "'d' has shape"),
    (lambda items: [("x" if n == "c" else n, t) for n, t in items], "'x' is not in the bucket plan"),
    (lambda items: _reorder(items, [0, 1, 3, 2, 4, 5, 6]), "'c' came at position 2"),
    (lambda items: items[:-1], "'head' and every later one are missing"),
    (lambda items: items + [("extra", torch.ones(1))], "'extra' came after all 7 tensors"),
])
def test_a_tensor_the_plan_does_not_expect_stops_before_the_last_bucket(change, message):
    plan = make_bucket_plan(((n, s, torch.float32) for n, s in SHAPES.items()), bucket_bytes=2048)
    yielded = []
    with pytest.raises(ValueError, match=message):
        for index, _ in iter_buckets(plan, change(list(_tensors(SHAPES))),
                                     lambda index, size: torch.empty(size, dtype=torch.uint8)):
            yielded.append(index)
    assert len(yielded) < len(plan.bucket_sizes_bytes)


def _receive_once(address, plan, queue):
    try:
        staged = WeightReceiver().receive(GroupSpec(address, 2, "mismatch", 2, op_timeout_s=30), 1, 1, plan)
        queue.put(f"staged {len(staged)} tensors")
    except Exception as exc:  # noqa: BLE001 - what the generator sees: a failed receive, nothing staged
        queue.put(f"failed: {type(exc).__name__}")


def test_a_plan_mismatch_fails_the_sender_and_stages_nothing_on_the_receiver():
    plan = make_bucket_plan(((n, s, torch.float32) for n, s in SHAPES.items()), bucket_bytes=2048)
    sender = WeightSender()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_receive_once, args=(sender.address, plan, queue))
    proc.start()
    try:
        wrong = [(n, t[:-1] if n == "head" else t) for n, t in _tensors(SHAPES)]
        with pytest.raises(ValueError, match="'head' has shape"):
            sender.send(GroupSpec(sender.address, 2, "mismatch", 2, op_timeout_s=30), 1, plan, wrong)
        assert queue.get(timeout=60).startswith("failed")
    finally:
        proc.join(timeout=30)
        sender.close()


def test_gloo_binds_the_interface_that_reaches_the_store():
    from tandem.weight_group import _local_interface_for

    assert _local_interface_for("localhost") == "127.0.0.1"
    assert _local_interface_for("127.0.0.2") == "127.0.0.1"  # the route to any loopback address is lo
