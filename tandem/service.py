"""What every service entry point shares: the common arguments, loading its settings, the
address file, and serving until SIGTERM/SIGINT with membership.

Entry points stay short: `args = parse_args(...)`, build the domain engine, then
`asyncio.run(serve(...))`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from tandem.membership import Announcement, Load, MembershipAgent
from tandem.rpc import RunningServer

COORDINATOR_WAIT_S = 900.0
"""How long a service waits for a coordinator that does not answer (not yet up, restarting, or
gone for good) before it stops with exit code 1."""

SettingsT = TypeVar("SettingsT", bound=BaseModel)


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--settings", type=Path, help="JSON file of this service's settings (defaults if absent)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--advertise-host", default=None, help="host others reach this service at (default: --host)")
    parser.add_argument("--coordinator", default=None, help="host:port of the coordinator to register with")
    parser.add_argument("--address-file", type=Path, default=None, help="write the bound host:port here once serving")
    parser.add_argument("--coordinator-wait-s", type=float,
                        default=float(os.environ.get("TANDEM_COORDINATOR_WAIT_S", COORDINATOR_WAIT_S)),
                        help="stop (exit 1) after the coordinator has not answered for this long; 0: wait forever "
                             f"(env TANDEM_COORDINATOR_WAIT_S, default {COORDINATOR_WAIT_S:.0f})")
    return parser.parse_args(argv)


def load_settings(path: Path | None, model: type[SettingsT]) -> SettingsT:
    """Parse the settings file; a bad file is a one-line error naming the key."""
    if path is None:
        return model()
    try:
        return model.model_validate_json(path.read_text())
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise SystemExit(f"{path}: {key}: {first['msg']}") from None


def write_address_file(path: Path, address: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(address)
    os.replace(tmp, path)


async def serve(running: RunningServer, args: argparse.Namespace, announcement: Announcement,
                load: Callable[[], Load], log, on_stop: Callable[[], Awaitable[None]] | None = None, *,
                ready: Callable[[], Awaitable[None]] | None = None, dead: Callable[[], bool] = lambda: False,
                drain: Callable[[], Awaitable[None]] | None = None, poll_s: float = 1.0,
                also: Sequence[tuple[Announcement, Callable[[], Load]]] = ()) -> int:
    """Serve until SIGTERM/SIGINT (exit code 0) or until `dead()` turns true (1: a supervisor
    restarts the process). `ready` is awaited first (e.g. loading the model) while health
    says NOT_SERVING; then health turns SERVING, the address file is written and the service
    announces itself. On a stop signal, with `drain`: tell the coordinator it is leaving (no
    new work), health NOT_SERVING, await `drain()` (the service finishes or hands back what it
    holds, bounded by its own timeout); then, and on death: NOT_SERVING, deregister,
    stop the server, `on_stop`. `also`: more roles the same server announces, each with its
    own membership (a trainer that also serves generation registers as a generator too). A
    coordinator that says the run is over stops the service as a signal would; one that has not
    answered for `args.coordinator_wait_s` stops it with exit code 1 (no drain: nobody to tell)."""
    stop, gone = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agents: list[MembershipAgent] = []
    try:
        if ready is not None:
            await ready()
        await running.mark_ready()
        if args.address_file:
            write_address_file(args.address_file, announcement.address)
        if args.coordinator:
            for role, role_load in [(announcement, load), *also]:
                agents.append(MembershipAgent(args.coordinator, running.token, role, role_load, log,
                                              on_run_over=stop.set, on_gone=lambda: (gone.set(), stop.set()),
                                              give_up_after_s=args.coordinator_wait_s))
                agents[-1].start()
        log.info("service_ready", address=announcement.address)
        exit_code = 0
        while not stop.is_set():
            if dead():
                exit_code = 1
                break
            try:
                await asyncio.wait_for(stop.wait(), poll_s)
            except TimeoutError:
                pass
        if gone.is_set():
            exit_code = 1  # the run it served is gone: not a clean stop
        if exit_code == 0 and drain is not None:
            await running.mark_not_serving()
            for agent in agents:
                await agent.leave()
            log.info("service_draining")
            await drain()
        log.info("service_stopping", exit_code=exit_code)
        return exit_code
    finally:
        await running.mark_not_serving()
        for agent in agents:
            await agent.stop()
        await running.stop(grace_s=2.0)  # first: late calls get UNAVAILABLE, never a closed engine
        if on_stop is not None:
            await on_stop()
