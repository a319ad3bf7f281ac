"""A member dropped for a brief silence comes back under its own id; one that is really gone
(killed, restarted, said goodbye) does not, and the detection bound stays timeout_s. No sockets."""

import time

import structlog

from coordinator.cluster.registry import MAX_SUSPECTED, Registry

LOG = structlog.get_logger()


class Events:
    def __init__(self):
        self.names: list[str] = []

    def _add(self, event, **fields):
        self.names.append(event)

    info = warning = debug = _add


def test_a_member_silent_past_the_timeout_is_lost_then_keeps_its_id_when_it_heartbeats_again():
    events = Events()
    registry = Registry(events, heartbeat_interval_s=0.01, timeout_s=0.05)
    trainer = registry.register("trainer", "127.0.0.1:1")
    time.sleep(0.1)
    assert registry.live() == [] and events.names[-1] == "member_lost"  # detected within timeout_s
    assert registry.heartbeat(trainer, num_inflight=0, weight_version=3)  # known: no re-registration
    [member] = registry.live()
    assert member.member_id == trainer and member.weight_version == 3 and events.names[-1] == "member_back"


def test_a_member_the_loop_removed_comes_back_under_its_id_unless_it_was_killed():
    registry = Registry(LOG, timeout_s=60)
    generator = registry.register("generator", "127.0.0.1:1")
    registry.remove(generator, reason="rpc failed")
    assert registry.heartbeat(generator, 0, 0) and [m.member_id for m in registry.live()] == [generator]
    registry.remove(generator, reason="trainer relaunched", may_return=False)
    assert not registry.heartbeat(generator, 0, 0) and registry.live() == []


def test_a_restart_at_the_same_address_or_a_goodbye_ends_the_old_id():
    registry = Registry(LOG, timeout_s=0.05)
    old = registry.register("generator", "127.0.0.1:1")
    time.sleep(0.1)
    registry.live()  # the silence is noticed
    new = registry.register("generator", "127.0.0.1:1")  # the restarted process registers anew
    assert not registry.heartbeat(old, 0, 0)  # the old process's id cannot come back beside it
    assert registry.heartbeat(new, 0, 0)

    gone = registry.register("reward", "127.0.0.1:2", tasks=("math",))
    time.sleep(0.1)
    registry.live()
    registry.deregister(gone)
    assert not registry.heartbeat(gone, 0, 0)


def test_the_memory_of_dropped_members_is_bounded():
    registry = Registry(LOG, timeout_s=60)
    ids = [registry.register("generator", f"127.0.0.1:{port}") for port in range(1, MAX_SUSPECTED + 11)]
    for member_id in ids:
        registry.remove(member_id, reason="test")
    assert not registry.heartbeat(ids[0], 0, 0) and registry.heartbeat(ids[-1], 0, 0)
