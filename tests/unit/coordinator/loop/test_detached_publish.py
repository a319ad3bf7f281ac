"""Async GRPO's detached publish, against in-process fakes: the loop gets control back as soon as
the trainer holds its copy (HoldWeights), the generators get the version afterwards (then
on_published runs), the next handover waits until they have it, publishes keep their order and
versions, and a failed one is raised by the next publish. The trainer's side keeps the version's
copy, so a retry resends the held weights, not newer ones."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import structlog
import torch

from coordinator.config import load_config
from coordinator.loop.context import LoopContext
from coordinator.membership.services import GeneratorHandle
from tandem.rpc import RpcFailure, Status
from tandem.weight_sync import make_bucket_plan
from trainer_svc.publish import DetachedPublishes
from trainer_svc.types import PublishResult

PLAN = make_bucket_plan([("w", (4,), torch.float32)])


class Trainer:
    def __init__(self):
        self.calls = []

    def info(self):
        return SimpleNamespace(weight_sync_store_address="127.0.0.1:1", bucket_plan=PLAN, device_type="cpu",
                               global_step=0)

    def hold_weights(self, version):
        self.calls.append(("hold", version))
        return PublishResult(16, 1)

    def publish_weights(self, group, version, detach=False):
        self.calls.append(("publish", version, detach))
        return PublishResult(16, 1)


class Generator:
    def __init__(self, release: threading.Event, fail: bool = False):
        self.release, self.fail, self.versions = release, fail, []

    def info(self, timeout_s=0):
        return self

    def load_weights(self, source, version, timeout_s=0):
        self.release.wait(10)  # the bytes take a while to arrive
        if self.fail:
            raise RpcFailure(Status.INVALID_ARGUMENT, "version refused")
        self.versions.append(version)
        return version


def _ctx(generator):
    services = SimpleNamespace(trainer=Trainer(), all_generators=lambda: [GeneratorHandle("g0", generator, 8)],
                               generator_failed=lambda h, e: None)
    cfg = load_config(overrides=["grpo.async_grpo.enabled=true"])
    return LoopContext.connect(cfg, services, None, [], 0, structlog.get_logger()), services.trainer


def test_the_loop_trains_on_while_the_generators_receive():
    release, published = threading.Event(), []
    generator = Generator(release)
    ctx, trainer = _ctx(generator)
    assert ctx.publish_detached(lambda: published.append(1)) == 1  # returned before any generator has it
    assert trainer.calls[0] == ("hold", 1) and generator.versions == [] and published == []
    second = ThreadPoolExecutor(1).submit(ctx.publish_detached, lambda: published.append(2))
    time.sleep(0.3)
    assert not second.done() and ("hold", 2) not in trainer.calls  # version 1 is still on its way
    release.set()
    assert second.result(timeout=5) == 2  # numbered in order
    ctx.wait_published()
    assert generator.versions == [1, 2] and published == [1, 2] and ctx.publisher.version == 2
    assert trainer.calls == [("hold", 1), ("publish", 1, False), ("hold", 2), ("publish", 2, False)]


def test_no_generator_is_caught_up_while_a_newer_version_is_held():
    release = threading.Event()
    release.set()
    ctx, trainer = _ctx(Generator(release))
    ctx.publish_detached(lambda: None)
    ctx.wait_published()
    late = GeneratorHandle("g1", Generator(release), 8)  # joined after version 1 went out
    ctx.publisher.hold(2)  # the trainer moved on to version 2 and holds no copy of 1
    assert ctx.publisher.admit([late]) == [] and late.client.versions == []
    assert ("publish", 1, False) == trainer.calls[-2] and trainer.calls[-1] == ("hold", 2)


def test_a_failed_detached_publish_is_raised_by_the_next_publish():
    release = threading.Event()
    release.set()
    ctx, _ = _ctx(Generator(release, fail=True))
    ctx.publish_detached(lambda: None)
    time.sleep(0.2)
    with pytest.raises(RpcFailure, match="version refused"):
        ctx.publish_detached(lambda: None)


def test_the_trainer_keeps_the_version_it_holds_and_resends_that_copy():
    weights = torch.ones(4)
    held = DetachedPublishes(structlog.get_logger())
    held.hold(iter([("w", weights)]), 7, PLAN)
    weights.add_(1.0)  # the trainer trains on
    assert held.holds(7) and torch.equal(held._held.tensors[0][1], torch.ones(4))  # the copy is version 7's
    assert held.start(iter([("w", weights)]), None, None, 7, PLAN) == 0  # a resend: no new copy, no thread here
    assert torch.equal(held._held.tensors[0][1], torch.ones(4))
    with pytest.raises(LookupError, match="weight version 8 is not held"):
        held.send_held(object(), None, 8, PLAN)
    held.forget()
    assert not held.holds(7)


def test_the_held_copy_is_one_block_in_the_generators_dtype_that_every_bucket_goes_from(monkeypatch):
    """Whatever plan the trainer publishes under (here the in-place plan of a trainer whose
    parameters are not a block), its held copy is laid out as that plan, in its dtype, and the
    detached send takes every bucket from it: nothing is packed."""
    from tandem import weight_sync
    from trainer_svc import publish

    weights = {"a": torch.randn(8, 8), "b": torch.randn(3), "c": torch.randn(5)}  # b and c share a bucket
    plan = make_bucket_plan([(n, tuple(t.shape), torch.bfloat16) for n, t in weights.items()], in_place_bytes=256)
    assert not plan.in_block and any(t.offset_bytes for t in plan.tensors)
    held = DetachedPublishes(structlog.get_logger())
    held.hold(iter(weights.items()), 3, plan)
    copies = dict(held._held.tensors)
    assert {t.dtype for t in copies.values()} == {torch.bfloat16}
    assert len({t.untyped_storage().data_ptr() for t in copies.values()}) == 1
    assert all(torch.equal(copies[n], t.bfloat16()) for n, t in weights.items())

    def sent(tensors, sender, group, version, plan):
        def no_packing(index, size):
            raise AssertionError(f"bucket {index} of the held copy was packed")
        return sum(b.numel() for _, b in weight_sync.iter_buckets(plan, tensors, no_packing,
                                                                  in_place_device=torch.device("cpu")))

    monkeypatch.setattr(publish, "publish_weights", sent)
    log = []
    held._log = SimpleNamespace(info=lambda *a, **k: log.append(k), warning=lambda *a, **k: log.append(k))
    held._send(held._held, None, SimpleNamespace(epoch=0), plan)
    assert log == [{"version": 3, "epoch": 0, "bytes": plan.total_bytes, "seconds": log[0]["seconds"]}]
