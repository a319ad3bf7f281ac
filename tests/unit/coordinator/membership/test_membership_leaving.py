"""Members that leave (drain) versus members that are gone, and their health, without sockets."""

import threading
import time

import pytest
import structlog

from coordinator.loop.rollout import GeneratorHandle, generate
from coordinator.membership.registry import Registry, health
from coordinator.membership.versions import WeightVersions
from tandem.generation.types import Completion, SamplingConfig

LOG = structlog.get_logger()


def test_a_draining_member_gets_no_work_but_stays_present_until_it_is_gone():
    registry = Registry(LOG, timeout_s=60)
    a = registry.register("generator", "127.0.0.1:1", capacity=4)
    b = registry.register("generator", "127.0.0.1:2", capacity=4)
    registry.deregister(b, draining=True)
    assert [m.member_id for m in registry.live("generator")] == [a]
    assert registry.present(b) and {m.member_id: m.leaving for m in registry.members("generator")} == {a: False, b: True}
    assert registry.heartbeat(b, num_inflight=3, weight_version=2)  # it still reports its load
    leaving = next(m for m in registry.members() if m.member_id == b)
    assert leaving.leaving and leaving.num_inflight == 3  # a heartbeat does not bring it back into rotation
    registry.deregister(b)  # drained and gone: out of every list, but its streams may still be arriving
    assert [m.member_id for m in registry.members()] == [a] and not registry.heartbeat(b, 0, 0)
    assert registry.present(b) and registry.present(a)
    registry.deregister(a)  # gone without draining
    assert not registry.present(a)


def test_a_drained_generators_last_stream_is_not_a_failure():
    """Its goodbye can reach the coordinator before the end of its last stream does."""
    registry = Registry(LOG, timeout_s=60)
    staying, leaving = SlowGenerator(), SlowGenerator()
    g0 = registry.register("generator", "127.0.0.1:1", capacity=4)
    g1 = registry.register("generator", "127.0.0.1:2", capacity=4)
    handles = [GeneratorHandle(g0, staying, 4), GeneratorHandle(g1, leaving, 4)]

    def drain_then_leave():  # SIGTERM; its call finishes on its side; it says it is gone; the stream ends
        time.sleep(0.2)
        registry.deregister(g1, draining=True)
        time.sleep(0.2)
        registry.deregister(g1)
        time.sleep(0.3)  # a few polls with the goodbye in and the stream still open
        staying.release.set()
        leaving.release.set()

    threading.Thread(target=drain_then_leave, daemon=True).start()
    failed = []
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=2, seed=5)
    groups = generate([[1]] * 6, sampling, lambda: [h for h in handles if h.member_id in
                                                    {m.member_id for m in registry.live()}],
                      lambda h, e: failed.append(h.member_id), LOG, poll_s=0.05, present=registry.present)
    assert failed == [] and staying.calls == 1 and leaving.calls == 1  # no re-send: its share came back
    assert all(len(group) == 2 for group in groups)


def test_a_silent_draining_member_is_lost_like_any_other():
    registry = Registry(LOG, timeout_s=0.05)
    member = registry.register("generator", "127.0.0.1:1")
    registry.deregister(member, draining=True)
    time.sleep(0.1)
    assert not registry.present(member)


def test_health():
    registry = Registry(LOG, heartbeat_interval_s=1.0)
    gen = registry.register("generator", "127.0.0.1:1")
    registry.heartbeat(gen, 0, 3)
    member = registry.members()[0]
    now = member.last_seen
    versions = WeightVersions()
    assert health(member, now, 1.0, versions) == "healthy"  # version 0: every generator loads the checkpoint
    versions.published(4, acknowledged=["someone-else"])
    assert health(member, now, 1.0, versions) == "stale_weights"  # the rule of WeightVersions, not heartbeats
    assert health(member, now, 1.0, None) == "healthy"  # not judged (the run is starting)
    versions.caught_up([gen])
    assert health(member, now, 1.0, versions) == "healthy"
    assert health(member, now + 2.5, 1.0, versions) == "late"
    registry.deregister(gen, draining=True)
    assert health(registry.members()[0], now, 1.0, versions) == "leaving"


class SlowGenerator:
    """Streams one completion per (prompt, sample) after `release` is set."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0

    def generate(self, prompts, sampling, request_id="", timeout_s=0):
        self.calls += 1
        self.release.wait(10)
        for i, _ in enumerate(prompts):
            for j in range(sampling.n):
                yield Completion(i, j, (sampling.sample_seed(i, j),), (0.0,), "stop", 0)

    def close(self):
        raise AssertionError("a draining generator's channel must not be closed")


def test_a_generator_that_leaves_mid_rollout_finishes_its_calls_and_gets_no_more():
    staying, leaving = SlowGenerator(), SlowGenerator()
    handles = [GeneratorHandle("g0", staying, 4), GeneratorHandle("g1", leaving, 4)]
    rotation = list(handles)

    def announce_leaving():  # SIGTERM: g1 leaves the rotation but keeps heartbeating while it drains
        time.sleep(0.2)
        rotation.remove(handles[1])
        time.sleep(0.3)
        staying.release.set()
        leaving.release.set()

    threading.Thread(target=announce_leaving, daemon=True).start()
    failed = []
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=2, seed=5)
    groups = generate([[1]] * 6, sampling, lambda: list(rotation), lambda h, e: failed.append(h.member_id), LOG,
                      poll_s=0.05, present=lambda member_id: True)
    assert failed == [] and staying.calls == 1 and leaving.calls == 1  # no re-send: its share came back
    for p, group in enumerate(groups):
        assert [c.token_ids[0] for c in group] == [sampling.sample_seed(p, j) for j in range(2)]


def test_an_announcement_the_run_could_not_use_is_refused():
    registry = Registry(structlog.get_logger())
    for address in ("💥", "host", "host:0", "host:99999", ":50051", "host:port", "a b:1", "h:1\n"):
        with pytest.raises(ValueError, match="is not host:port"):
            registry.register("generator", address)
    with pytest.raises(ValueError, match="cannot be negative"):
        registry.register("generator", "h:1", capacity=-1)
    with pytest.raises(ValueError, match="must name the tasks"):
        registry.register("reward", "h:2", tasks=("",))
    assert registry.register("reward", "[::1]:2", tasks=("math",)) and not registry.live("generator")
