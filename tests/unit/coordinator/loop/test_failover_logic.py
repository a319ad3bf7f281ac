"""Rollout re-sends and publish retries against in-process fakes (no sockets)."""

import threading
import time
from dataclasses import dataclass

import pytest
import structlog

from coordinator.loop.rollout import contiguous_runs, generate
from coordinator.loop.weights.publisher import PublishError, WeightPublisher
from coordinator.loop.weights.transports import CollectiveTransport
from coordinator.membership.services import GeneratorHandle
from tandem.generation.types import Completion, SamplingConfig
from tandem.rpc import RpcFailure, Status
from tandem.weight_sync import BucketPlan

LOG = structlog.get_logger()


def FakeRpcError(status=Status.UNAVAILABLE, details="peer gone") -> RpcFailure:
    return RpcFailure(status, details)


class FakeGenerator:
    """Streams one completion per (prompt, sample) whose single token is the sample's seed.
    `die_after`: raise UNAVAILABLE after that many completions; `hang`: block until closed."""

    def __init__(self, die_after=None, hang=False):
        self.die_after, self.hang = die_after, hang
        self.closed = threading.Event()
        self.calls = []
        self.version, self.dead, self.fail_receive = 0, False, False

    def generate(self, prompts, sampling, request_id="", timeout_s=0):
        self.calls.append(len(prompts))
        sent = 0
        for i, _ in enumerate(prompts):
            for j in range(sampling.n):
                if self.die_after is not None and sent >= self.die_after:
                    raise FakeRpcError()
                if self.hang:
                    self.closed.wait(10)
                    raise FakeRpcError(Status.CANCELLED)
                yield Completion(i, j, (sampling.sample_seed(i, j),), (0.0,), "stop", self.version)
                sent += 1

    def close(self):
        self.closed.set()

    def info(self, timeout_s=0):
        if self.dead:
            raise FakeRpcError()
        return self

    def load_weights(self, source, version, timeout_s=0):
        if self.fail_receive:
            raise FakeRpcError(details="broadcast failed")
        self.version = version
        return version


def _handles(*gens):
    return [GeneratorHandle(f"g{i}", g, 4) for i, g in enumerate(gens)]


def _check_every_seed(groups, sampling):
    for p, group in enumerate(groups):
        assert [c.token_ids[0] for c in group] == [sampling.sample_seed(p, j) for j in range(sampling.n)]


def test_contiguous_runs():
    assert contiguous_runs([0, 1, 2, 5, 6, 9]) == [[0, 1, 2], [5, 6], [9]]
    assert contiguous_runs([]) == []


def test_a_generator_that_errors_mid_stream_loses_no_sample_and_keeps_seeds():
    handles = _handles(FakeGenerator(), FakeGenerator(die_after=3))
    live = list(handles)
    failed = []

    def on_failure(handle, exc):
        failed.append(handle.member_id)
        live.remove(handle)

    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=2, seed=1000)
    groups = generate([[1]] * 8, sampling, lambda: list(live), on_failure, LOG)
    assert failed == ["g1"] and len(groups) == 8
    _check_every_seed(groups, sampling)  # re-sent prompts got the seeds they would have had


def test_a_generator_that_hangs_is_dropped_once_it_leaves_membership():
    hung = FakeGenerator(hang=True)
    handles = _handles(FakeGenerator(), hung)
    started = time.monotonic()

    def live():  # the registry drops the hung one after its heartbeats stop (here: after 0.3 s)
        return handles if time.monotonic() - started < 0.3 else handles[:1]

    def on_failure(handle, exc):
        handle.client.close()  # Services.generator_failed closes the channel: the stream ends

    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=2, seed=7)
    groups = generate([[1]] * 6, sampling, live, on_failure, LOG, poll_s=0.05)
    assert time.monotonic() - started < 3 and hung.closed.is_set()
    _check_every_seed(groups, sampling)


def test_a_malformed_request_is_not_resent():
    class Refusing(FakeGenerator):
        def generate(self, *a, **k):
            raise FakeRpcError(Status.INVALID_ARGUMENT, "prompt too long")
            yield

    with pytest.raises(RpcFailure, match="INVALID_ARGUMENT"):
        generate([[1]], SamplingConfig(n=1, temperature=1.0, max_tokens=1, seed=0), lambda: _handles(Refusing()), lambda *a: None, LOG)


@dataclass
class FakeTrainer:
    fail_times: int = 0
    global_step: int = 0

    def __post_init__(self):
        self.groups = []

    def publish_weights(self, group, version, detach=False):
        self.groups.append(group)
        if self.fail_times:
            self.fail_times -= 1
            raise FakeRpcError(details="weight broadcast to epoch failed: Connection reset by peer")
        return type("R", (), {"bytes_sent": 10})()

    def info(self):
        return self


PLAN = BucketPlan((), (10,))


def _publisher(trainer, **kwargs) -> WeightPublisher:
    return WeightPublisher(trainer, CollectiveTransport(trainer, "127.0.0.1:1", PLAN, LOG, op_timeout_s=1.0), LOG,
                           **kwargs)


def test_a_publish_that_fails_part_way_is_retried_on_a_new_epoch_without_the_dead():
    alive, dying = FakeGenerator(), FakeGenerator()
    handles = _handles(alive, dying)
    trainer = FakeTrainer(fail_times=1)
    dropped = []
    publisher = _publisher(trainer, on_dead=lambda h, e: dropped.append(h.member_id))
    original = dying.load_weights

    def die(*args, **kwargs):  # dies during the broadcast: the receive fails, then GetInfo too
        dying.dead = True
        raise FakeRpcError(details="connection reset")

    dying.load_weights = die
    report = publisher.publish(handles)
    assert report.attempts == 2 and report.num_generators == 1 and report.version == 1
    assert [g.epoch for g in trainer.groups] == [0, 1] and [g.world_size for g in trainer.groups] == [3, 2]
    assert dropped == ["g1"] and alive.version == 1
    assert [h.member_id for h in publisher.admit(handles)] == ["g0"]
    dying.load_weights = original
    assert publisher.publish(handles[:1]).epoch == 1  # same members: the epoch stays


def test_a_bucket_that_arrived_corrupted_fails_the_attempt_and_the_publish_is_retried_to_the_same_generator():
    gen = FakeGenerator()
    trainer = FakeTrainer()
    dropped = []
    publisher = _publisher(trainer, on_dead=lambda h, e: dropped.append(h.member_id))
    original, attempts = gen.load_weights, []

    def corrupted_once(source, version, timeout_s=0):  # the generator's answer to a checksum mismatch
        attempts.append(source.group.epoch)
        if len(attempts) == 1:
            raise FakeRpcError(Status.UNAVAILABLE, "ConnectionError: reading weight version 1 from CollectiveSource "
                                                   "failed, version 0 keeps serving: WeightChecksumError: bucket 3 of "
                                                   "7 of weight version 1 (1024 bytes) arrived corrupted")
        return original(source, version, timeout_s)

    gen.load_weights = corrupted_once
    report = publisher.publish(_handles(gen))
    assert report.attempts == 2 and attempts == [0, 1]  # resent on a new epoch, never reusing the failed group
    assert gen.version == 1 and not dropped  # it answers GetInfo: kept, and it serves the resent version


def test_a_publish_with_nobody_left_records_the_version_for_the_next_generator_to_come():
    gen = FakeGenerator()
    gen.dead = True
    trainer = FakeTrainer()
    publisher = _publisher(trainer)
    report = publisher.publish(_handles(gen))
    assert report.num_generators == 0 and publisher.version == 1 and not trainer.groups  # nothing was sent
    relaunched = FakeGenerator()
    assert [h.member_id for h in publisher.admit(_handles(relaunched))] == ["g0"] and relaunched.version == 1
    flaky = FakeGenerator()
    flaky.fail_receive = True
    with pytest.raises(PublishError, match="failed 3 times"):
        publisher.publish(_handles(flaky))


def test_a_late_joiner_is_caught_up_before_it_gets_work_and_only_while_safe():
    old, new = FakeGenerator(), FakeGenerator()
    trainer = FakeTrainer()
    publisher = _publisher(trainer)
    publisher.publish(_handles(old))
    assert publisher.version == 1 and new.version == 0
    handles = _handles(old, new)
    trainer.global_step = 1  # the trainer stepped: its weights are no longer version 1
    assert [h.member_id for h in publisher.admit(handles)] == ["g0"] and new.version == 0
    trainer.global_step = 0
    assert [h.member_id for h in publisher.admit(handles)] == ["g0", "g1"] and new.version == 1
    assert trainer.groups[-1].world_size == 2  # a group of the trainer and the late joiner only
