"""The weight-sync group's policy, checked on CPU: backend and NCCL error policy by device kind,
the device-kind agreement of both ends, completion (wait, then the stream), the receive loop's
memory bound and order, and abort on failure."""

import os
import threading
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from tandem import weight_group, weight_sync
from tandem.stores import serve_store
from tandem.weight_group import (
    DeviceKindMismatch,
    EpochGroup,
    agree_on_device,
    complete,
    make_group,
    nccl_init_timeout_env,
)
from tandem.weight_plan import GroupSpec
from tandem.weight_sync import WeightChecksumError, bucket_checksum, iter_buckets, make_bucket_plan, receive_buckets

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
NCCL_KEYS = ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_NONBLOCKING_TIMEOUT")


class _Config:
    blocking = 1


class _FakeNccl:
    """Stands in for ProcessGroupNCCL (absent from CPU builds): records what it was built with."""

    built: ClassVar[list] = []

    class Options:
        def __init__(self):
            self._timeout = None
            self.config = _Config()

    def __init__(self, store, rank, size, opts):
        _FakeNccl.built.append(({k: os.environ.get(k) for k in NCCL_KEYS}, opts._timeout, opts.config.blocking))


def test_nccl_group_is_built_blocking_wait_without_teardown_and_nonblocking_init(monkeypatch):
    for key in NCCL_KEYS:
        monkeypatch.setenv(key, "unset after the test")  # recorded, so the undo removes what the code sets
        monkeypatch.delenv(key)
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _FakeNccl, raising=False)
    monkeypatch.setattr(weight_group, "agree_on_device", lambda *args: None)
    _FakeNccl.built = []
    make_group(dist.HashStore(), GroupSpec("127.0.0.1:1", 3, "s", 2, op_timeout_s=42.5), 0, CUDA)
    (env, timeout, blocking), = _FakeNccl.built
    assert env == {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
                   "TORCH_NCCL_NONBLOCKING_TIMEOUT": "42"}
    assert timeout.total_seconds() == 42.5 and blocking == 0
    # the error policy only while the weight-sync group is built (the trainer's own group keeps its
    # own); the init timeout for the process, since torch reads it once, lazily
    assert not any(key in os.environ for key in NCCL_KEYS[:2])
    assert os.environ["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "42"


def test_gloo_group_sets_no_nccl_policy(monkeypatch):
    built = []

    class FakeGloo:
        class _Options:
            pass

        create_device = staticmethod(lambda hostname: hostname)

        def __init__(self, store, rank, size, opts):
            built.append({k: os.environ.get(k) for k in NCCL_KEYS})

    for key in NCCL_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(dist, "ProcessGroupGloo", FakeGloo)
    monkeypatch.setattr(weight_group, "agree_on_device", lambda *args: None)
    make_group(dist.HashStore(), GroupSpec("127.0.0.1:1", 0, "s", 2), 1, CPU)
    assert built == [dict.fromkeys(NCCL_KEYS)]
    assert nccl_init_timeout_env(0.2)["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "1"  # never 0 (no timeout)


def _agree(store_port, rank, kind, results):
    from tandem.weight_group import dist as d

    store = d.TCPStore("127.0.0.1", store_port, is_master=False)
    try:
        agree_on_device(store, GroupSpec(f"127.0.0.1:{store_port}", 7, "x", 2, op_timeout_s=10), rank,
                        torch.device(kind))
        results[rank] = "ok"
    except DeviceKindMismatch as exc:
        results[rank] = str(exc)


@pytest.mark.parametrize("trainer, generator", [("cuda", "cpu"), ("cpu", "cuda"), ("cuda", "cuda"), ("cpu", "cpu")])
def test_both_ends_check_the_device_kind_before_the_group_forms(trainer, generator):
    server = serve_store("127.0.0.1")
    results = {}
    threads = [threading.Thread(target=_agree, args=(server.port, rank, kind, results))
               for rank, kind in ((0, trainer), (1, generator))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if trainer == generator:
        assert results == {0: "ok", 1: "ok"}
        return
    for message in results.values():
        assert f"trainer publishes from {trainer}" in message and f"generator rank 1 runs on {generator}" in message


class _Work:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(("wait", self.name))


def test_complete_synchronizes_the_cuda_stream_after_the_wait(monkeypatch):
    log = []

    class Stream:
        def synchronize(self):
            log.append(("synchronize", "stream"))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    complete(_Work(log, "bucket"), CUDA)
    assert log == [("wait", "bucket"), ("synchronize", "stream")]
    log.clear()
    complete(_Work(log, "bucket"), CPU)
    assert log == [("wait", "bucket")]  # gloo's wait already means done


SHAPES = {"embed": (50, 16), "a": (16, 16), "b": (16,), "c": (64, 16), "d": (16, 16), "e": (3,), "head": (50, 16)}


def _wire(plan, buckets, checksums=None):
    """What the sender broadcasts, in order: each checksum window's buckets, then its checksums."""
    checksums = checksums or [bucket_checksum(b) for b in buckets]
    return [x for window in plan.windows()
            for x in [*(buckets[i] for i in window), torch.cat([checksums[i] for i in window])]]


class _Group:
    """A fake group: each broadcast fills its tensor with what the sender sent next (`_wire`)."""

    def __init__(self, plan, buckets, log, checksums=None):
        self.log, self.storages = log, set()
        self.sent = iter(_wire(plan, buckets, checksums))

    def broadcast(self, tensors, opts):
        (tensor,) = tensors
        tensor.copy_(next(self.sent))
        if tensor.dtype == torch.int64:
            self.log.append(("post", "checksums"))
            return _Work(self.log, "checksums")
        self.storages.add(tensor.untyped_storage().data_ptr())
        self.log.append(("post", tensor.numel()))
        return _Work(self.log, tensor.numel())


def _packed(seed, **plan_options):
    gen = torch.Generator().manual_seed(seed)
    state = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    plan = make_bucket_plan(((n, s, torch.float32) for n, s in SHAPES.items()), bucket_bytes=2048, **plan_options)
    sent = [b.clone() for _, b in iter_buckets(plan, state.items(), lambda i, size: torch.empty(size, dtype=torch.uint8))]
    return state, plan, sent


@pytest.mark.parametrize("window_bytes", [None, 4096])
def test_receive_holds_two_bucket_buffers_and_hands_each_bucket_out_only_once_complete(monkeypatch, window_bytes):
    state, plan, sent = _packed(1, checksum_window_bytes=window_bytes)
    assert len(plan.bucket_sizes_bytes) >= 4
    log = []
    group = _Group(plan, sent, log)
    monkeypatch.setattr(weight_sync, "complete",
                        lambda work, device: work.name == "checksums" or log.append(("complete", work.name)))
    received, kept = {}, []

    def keep(index, bucket):
        kept.append(index)  # copied out before its buffer takes the bucket two later is posted
        assert sum(e[0] == "post" and e[1] != "checksums" for e in log) <= index + 2
        return bucket.clone()

    windows = {i: window for window in plan.windows() for i in window}
    for index, bucket, specs in receive_buckets(group, plan, CPU, 5.0, keep=keep):
        # handed out only once its whole window arrived; at most one bucket posted past that
        assert sum(e[0] == "complete" for e in log) == windows[index].stop
        assert sum(e[0] == "post" and e[1] != "checksums" for e in log) <= windows[index].stop + 1
        for t in specs:
            received[t.name] = bucket[t.offset_bytes:t.offset_bytes + t.size_bytes].clone().view(torch.float32)
    assert len(group.storages) == 2  # two buffers on the device whatever the number of buckets
    assert kept == list(range(len(sent)))
    assert [e for e in log if e[0] == "complete"] == [("complete", s) for s in plan.bucket_sizes_bytes]
    for name, tensor in state.items():
        assert torch.equal(received[name].view(tensor.shape), tensor), name


def test_reused_buffers_without_keep_are_refused():
    _, plan, sent = _packed(1)
    with pytest.raises(ValueError, match="needs `keep`"):
        next(receive_buckets(_Group(plan, sent, []), plan, CPU, 5.0))


def test_windows_group_buckets_and_their_checksums_go_in_one_broadcast_after_the_last():
    _, plan, sent = _packed(4, checksum_window_bytes=4096)
    windows = plan.windows()
    assert len(windows) < len(sent) and [i for w in windows for i in w] == list(range(len(sent)))
    assert all(sum(plan.bucket_sizes_bytes[i] for i in w) >= 4096 for w in windows[:-1])
    assert plan.digest() != make_bucket_plan(((n, s, torch.float32) for n, s in SHAPES.items()), 2048).digest()
    with pytest.raises(ValueError, match="must rise strictly and end at the bucket count"):
        type(plan)(plan.tensors, plan.bucket_sizes_bytes, (1, 1, len(sent)))
    with pytest.raises(ValueError, match="must rise strictly and end at the bucket count"):
        type(plan)(plan.tensors, plan.bucket_sizes_bytes, (1,))


@pytest.mark.parametrize("window_bytes", [None, 4096])
def test_a_streamed_receive_lands_in_fresh_memory_and_posts_a_bounded_number_ahead(monkeypatch, window_bytes):
    _, plan, sent = _packed(3, checksum_window_bytes=window_bytes)
    group = _Group(plan, sent, [])
    monkeypatch.setattr(weight_sync, "complete", lambda work, device: None)
    made = []

    def into(index, size):
        made.append(index)
        return torch.empty(size, dtype=torch.uint8)

    windows = plan.windows()
    assert len(windows) > 2
    of_bucket = {i: w for w, window in enumerate(windows) for i in window}
    kept = []
    for index, bucket, _ in receive_buckets(group, plan, CPU, 5.0, into=into, ahead=2):
        # this bucket's window, the next one whole (the wire fills it meanwhile), at most two buckets past that
        ahead_of = windows[min(of_bucket[index] + 1, len(windows) - 1)]
        assert made == list(range(min(ahead_of.stop + 2, len(sent))))
        assert torch.equal(bucket, sent[index])
        kept.append(bucket)
    assert len(group.storages) == len(sent)  # each bucket arrived in the memory handed out: nothing copied


@pytest.mark.parametrize("window_bytes", [None, 4096])
def test_a_bucket_that_arrives_corrupted_is_never_handed_out(monkeypatch, window_bytes):
    _, plan, sent = _packed(2, checksum_window_bytes=window_bytes)
    checksums = [bucket_checksum(b) for b in sent]
    (broken,) = [w for w in plan.windows() if 2 in w]
    sent[2][100] ^= 0x01  # one bit flipped in flight, after the sender took its checksum
    monkeypatch.setattr(weight_sync, "complete", lambda work, device: None)
    handed_out = []
    into = lambda index, size: torch.empty(size, dtype=torch.uint8)
    with pytest.raises(WeightChecksumError, match="bucket 2 of .* of weight version 7 .* arrived corrupted"):
        for index, _, _ in receive_buckets(_Group(plan, sent, [], checksums), plan, CPU, 5.0, into=into, version=7):
            handed_out.append(index)
    assert handed_out == list(range(broken.start))  # nothing of the broken bucket's window


def test_checksum_changes_with_any_one_word_and_costs_one_read():
    bucket = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    base = bucket_checksum(bucket)
    for position in (0, 7, 8, 4095):
        for bit in (0, 7):
            flipped = bucket.clone()
            flipped[position] ^= 1 << bit
            assert not torch.equal(bucket_checksum(flipped), base), (position, bit)
    assert base.dtype == torch.int64 and base.shape == (1,)


def test_a_failed_nccl_group_is_aborted_a_gloo_one_shut_down():
    class Group:
        def __init__(self):
            self.calls = []

        def abort(self):
            self.calls.append("abort")

        def shutdown(self):
            self.calls.append("shutdown")

    for device, failed, expected in ((CUDA, True, "abort"), (CUDA, False, "shutdown"), (CPU, True, "shutdown")):
        holder, group = EpochGroup(), Group()
        holder._group, holder._device = group, device
        holder.close(failed=failed)
        assert group.calls == [expected]
