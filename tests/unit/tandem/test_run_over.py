"""The end of a run ends the services it did not start (compose, other hosts): the coordinator's
heartbeat replies say "run over", each service stops as on SIGTERM (drains, leaves, returns 0),
and the coordinator waits until every one has left. Real gRPC on 127.0.0.1, a real service loop
(tandem.service.serve), no model."""

import asyncio
import threading
import time

import structlog

from coordinator.membership.dismiss import dismiss_services
from coordinator.membership.registry import Registry
from coordinator.membership.server import CoordinatorServer
from coordinator.membership.status import RunStatus
from tandem.membership import Announcement, Load
from tandem.rpc import start_server
from tandem.service import parse_args, serve

TOKEN = "run-over-token"


def test_a_finished_run_drains_and_stops_its_external_services():
    log = structlog.get_logger()
    registry = Registry(log, heartbeat_interval_s=0.1, timeout_s=5)
    coordinator = CoordinatorServer(registry, RunStatus("t"), host="127.0.0.1", port=0, token=TOKEN, log=log)
    address = coordinator.start()
    drained, result = [], {}

    async def service() -> int:
        running = await start_server([], ["tandem.test.v1.Nothing"], host="127.0.0.1", port=0, token=TOKEN, log=log)
        args = parse_args("probe", ["--coordinator", address])  # the services' own parser

        async def drain() -> None:
            drained.append(time.monotonic())

        return await serve(running, args, Announcement("reward", running.address, tasks=["arithmetic"]),
                           lambda: Load(), log, drain=drain, poll_s=0.05)

    def end_the_run() -> None:  # the coordinator's side, once the service has joined
        deadline = time.monotonic() + 30
        while not registry.live("reward") and time.monotonic() < deadline:
            time.sleep(0.02)
        result["started"] = time.monotonic()
        result["still_there"] = dismiss_services(registry, timeout_s=20, log=log)
        result["ended"] = time.monotonic()

    ender = threading.Thread(target=end_the_run, daemon=True)
    ender.start()
    try:
        code = asyncio.run(asyncio.wait_for(service(), 60))  # serve() wants the main thread (signal handlers)
        ender.join(timeout=30)
        assert code == 0 and len(drained) == 1  # stopped as on SIGTERM: drained, exit code 0
        assert result["still_there"] == [] and registry.members() == []
        assert result["ended"] - result["started"] < 10
    finally:
        coordinator.stop()
