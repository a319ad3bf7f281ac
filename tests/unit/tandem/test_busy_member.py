"""Busy is not dead: a service whose engine holds the CPU (and the GIL) for longer than the
coordinator's heartbeat timeout stays a member under the same id. A real coordinator server on
127.0.0.1 with a 0.1 s heartbeat interval and a 0.6 s timeout; the service side is shaped like
the trainer's rank 0 (trainer_svc/__main__.py): an asyncio event loop that serves and runs the
membership agent, and one engine thread that does the work."""

import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import structlog
import torch

from coordinator.membership.registry import Registry
from coordinator.membership.server import CoordinatorServer
from coordinator.membership.status import RunStatus
from coordinator.membership.vitals import process_vitals
from tandem.membership import Announcement, Load, MembershipAgent
from tests.procs import Events

TOKEN = "busy-member-token"
STEP_S = 2.0  # > TIMEOUT_S: a member starved for the whole step would be dropped
TIMEOUT_S = 0.6


def python_busy_loop() -> None:
    """Pure Python: holds the GIL except at the interpreter's switch points."""
    end, n = time.monotonic() + STEP_S, 0
    while time.monotonic() < end:
        n += 1


def torch_heavy() -> None:
    """Matrix products and a backward pass on every intra-op thread (all cores)."""
    a = torch.randn(512, 512, requires_grad=True)
    end = time.monotonic() + STEP_S
    while time.monotonic() < end:
        (a @ a @ a).logsumexp(-1).sum().backward()


@pytest.mark.parametrize("where", ["engine", "loop"])
@pytest.mark.parametrize("step", [python_busy_loop, torch_heavy], ids=["python", "torch"])
def test_a_member_busy_for_longer_than_the_heartbeat_timeout_is_not_lost(step, where):
    """where=engine: the step runs on the engine thread (a train step). where=loop: it blocks the
    service's event loop itself (sync work in a handler)."""
    events = Events()
    registry = Registry(events, heartbeat_interval_s=0.1, timeout_s=TIMEOUT_S)
    coordinator = CoordinatorServer(registry, RunStatus("t"), host="127.0.0.1", port=0, token=TOKEN,
                                    log=structlog.get_logger())
    address = coordinator.start()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
    agent = MembershipAgent(address, TOKEN, Announcement("trainer", "127.0.0.1:1"), Load, events)
    loop.call_soon_threadsafe(agent.start)
    try:
        deadline = time.monotonic() + 30
        while not registry.live("trainer"):
            assert time.monotonic() < deadline, "the agent did not register"
            time.sleep(0.02)
        [joined] = registry.live("trainer")

        async def run_step() -> None:
            if where == "engine":
                await loop.run_in_executor(engine, step)
            else:
                step()

        done = asyncio.run_coroutine_threadsafe(run_step(), loop)
        seen = []
        while not done.done():  # the coordinator's view during the step (members() drops the silent)
            seen.append(tuple(m.member_id for m in registry.live("trainer")))
            time.sleep(0.05)
        done.result()
        time.sleep(3 * TIMEOUT_S)
        seen.append(tuple(m.member_id for m in registry.live("trainer")))
        assert set(seen) == {(joined.member_id,)}, seen
        assert "member_lost" not in events.names and events.names.count("registered") == 1
    finally:
        asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        engine.shutdown()
        coordinator.stop()


MEMBER = r"""
import asyncio, os, sys, time
from tandem.membership import Announcement, Load, MembershipAgent

def hold_the_gil(seconds):
    # one C call that never lets go of the GIL: no thread of this process runs meanwhile
    t = time.perf_counter(); sum(range(10 ** 6)); per_item = (time.perf_counter() - t) / 10 ** 6
    sum(range(int(seconds / per_item)))

class Quiet:  # stdout is the test's channel
    def __getattr__(self, name):
        return lambda *args, **fields: None

async def main():
    agent = MembershipAgent(sys.argv[1], os.environ["TANDEM_TOKEN"], Announcement("trainer", "127.0.0.1:1"),
                            Load, Quiet())
    agent.start()
    await asyncio.to_thread(sys.stdin.readline)  # the test says when to step
    print("step", flush=True)
    hold_the_gil(float(sys.argv[2]))
    print("done", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await agent.stop()

asyncio.run(main())
"""


@pytest.mark.parametrize("vitals", [True, False], ids=["vitals", "silence-only"])
def test_a_member_whose_step_holds_the_gil_throughout_is_kept_while_its_process_works(vitals):
    """No heartbeat can leave a process whose GIL is held for the whole step: the coordinator
    keeps it because its process is there and burning CPU (a local run's services); judged by
    silence alone (members from other hosts) it is dropped, and comes back under its id."""
    events = Events()
    registry = Registry(events, heartbeat_interval_s=0.1, timeout_s=TIMEOUT_S,
                        vitals=process_vitals if vitals else None)
    coordinator = CoordinatorServer(registry, RunStatus("t"), host="127.0.0.1", port=0, token=TOKEN,
                                    log=structlog.get_logger())
    address = coordinator.start()
    member = subprocess.Popen([sys.executable, "-c", MEMBER, address, str(STEP_S + 0.5)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "TANDEM_TOKEN": TOKEN})
    try:
        deadline = time.monotonic() + 60
        while not registry.live("trainer"):
            assert time.monotonic() < deadline and member.poll() is None, "the member did not register"
            time.sleep(0.02)
        [joined] = registry.live("trainer")
        member.stdin.write("go\n")
        member.stdin.flush()
        assert member.stdout.readline() == "step\n"
        seen = []
        done = threading.Thread(target=member.stdout.readline)
        done.start()
        while done.is_alive():
            seen.append(tuple(m.member_id for m in registry.live("trainer")))
            time.sleep(0.05)
        time.sleep(3 * TIMEOUT_S)  # heartbeats again
        after = [m.member_id for m in registry.live("trainer")]
        if vitals:
            assert set(seen) == {(joined.member_id,)} and "member_lost" not in events.names, seen
        else:
            assert () in seen and "member_lost" in events.names and "member_back" in events.names
        assert after == [joined.member_id] and events.names.count("member_joined") == 1
    finally:
        member.stdin.write("stop\n")
        member.stdin.close()
        member.wait(timeout=30)
        coordinator.stop()
