"""Services.reward_failed when several callers report the same dead service at once (an
environment service's episodes all fail together when it dies: coordinator/loop/gateway/agents.py)."""

from __future__ import annotations

from coordinator.membership.services import Services


class FakeClient:
    closed = 0

    def close(self):
        self.closed += 1


class ReentrantRegistry:
    """remove() lets a second caller report the same member in between, as another thread may."""

    def __init__(self):
        self.removed, self.services, self.client = [], None, None

    def remove(self, member_id, reason, **kwargs):
        self.removed.append(member_id)
        if len(self.removed) == 1:
            self.services.reward_failed(self.client, RuntimeError("the other episode's failure"))


def test_a_service_reported_dead_twice_at_once_is_dropped_once_without_error():
    registry = ReentrantRegistry()
    services = Services(registry, "token", log=None)
    client = FakeClient()
    services._clients["reward-1"] = client
    registry.services, registry.client = services, client
    services.reward_failed(client, RuntimeError("socket closed"))  # raised KeyError before the fix
    assert registry.removed == ["reward-1", "reward-1"] and client.closed == 1 and not services._clients
