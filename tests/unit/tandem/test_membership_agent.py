"""The membership agent against a real coordinator server on 127.0.0.1 (no model): it notices
the coordinator is gone, re-registers with a new one on the same address without restarting,
and leaves in two steps (draining, then gone)."""

import asyncio
import threading
import time

import structlog

from coordinator.membership.registry import Registry
from coordinator.membership.server import CoordinatorServer
from coordinator.membership.status import RunStatus
from tandem.membership import Announcement, Load, MembershipAgent
from tests import procs
from tests.procs import Events

TOKEN = "agent-test-token"


def _server(port: int) -> tuple[CoordinatorServer, Registry, str]:
    log = structlog.get_logger()
    registry = Registry(log, heartbeat_interval_s=0.1, timeout_s=5)
    server = CoordinatorServer(registry, RunStatus("t"), host="127.0.0.1", port=port, token=TOKEN, log=log)
    return server, registry, server.start()


def _until(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_agent_re_registers_with_a_restarted_coordinator_and_leaves_in_two_steps():
    server, registry, address = _server(0)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    events = Events()
    agent = MembershipAgent(address, TOKEN, Announcement("generator", "127.0.0.1:1", capacity=8),
                            lambda: Load(num_inflight=2, weight_version=3), events)
    loop.call_soon_threadsafe(agent.start)
    try:
        _until(lambda: registry.live("generator"), "the first registration")
        first = registry.live("generator")[0]
        _until(lambda: registry.live("generator")[0].weight_version == 3, "a heartbeat")

        server.stop()  # the coordinator dies ...
        _until(lambda: "coordinator_lost" in events.names, "the agent to notice")
        server, registry, again = _server(int(address.rpartition(":")[2]))  # ... and comes back on its address
        assert again == address
        _until(lambda: registry.live("generator"), "the re-registration")
        member = registry.live("generator")[0]
        assert member.address == first.address and member.member_id != first.member_id and member.capacity == 8
        # the registry sees the member before the agent has read the reply and logged it
        _until(lambda: "coordinator_back" in events.names and events.names.count("registered") == 2,
               "the agent to log its return")

        asyncio.run_coroutine_threadsafe(agent.leave(), loop).result(timeout=10)
        assert registry.live() == [] and registry.present(member.member_id)  # draining: present, no new work
        time.sleep(0.5)
        assert registry.present(member.member_id) and events.names.count("registered") == 2  # not back in rotation
        asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(timeout=10)
        assert member.member_id not in {m.member_id for m in registry.members()}  # gone after draining
    finally:
        loop.call_soon_threadsafe(loop.stop)
        server.stop()


def test_an_agent_whose_coordinator_never_answers_gives_up_once_and_says_so():
    """A service started for a run that is over (or never came up) must not retry forever."""
    address = f"127.0.0.1:{procs.free_port()}"
    events, gone = Events(), []

    async def main():
        agent = MembershipAgent(address, TOKEN, Announcement("generator", "127.0.0.1:1"), Load, events,
                                give_up_after_s=0.5, on_gone=lambda: gone.append(time.monotonic()))
        agent.start()
        assert await asyncio.to_thread(agent.join, 30)  # the agent stopped trying by itself
        await agent.stop()

    asyncio.run(main())
    assert len(gone) == 1 and events.names.count("coordinator_unreachable") == 1
    assert events.names[-1] == "coordinator_gone"
