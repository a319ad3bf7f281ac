"""tandem.service.serve's stop order: the server stops taking calls before `on_stop` closes the
engine (a reward service whose thread pool was closed first answered a late Score with
INTERNAL, which ends a run; UNAVAILABLE sends the caller elsewhere). Real gRPC on 127.0.0.1."""

import asyncio
import os
import signal

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.membership import Announcement, Load
from tandem.rpc import start_server
from tandem.service import parse_args, serve

TOKEN = "service-stop-token"


def test_on_stop_runs_once_the_server_refuses_calls():
    log = structlog.get_logger()
    seen: list[str] = []

    async def service() -> int:
        running = await start_server([], ["tandem.test.v1.Nothing"], host="127.0.0.1", port=0, token=TOKEN, log=log)

        async def ready() -> None:  # SIGTERM once serving: the usual way a service is told to stop
            asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)

        async def on_stop() -> None:  # what a late caller gets while the engine closes
            async with grpc.aio.insecure_channel(running.address) as channel:
                try:
                    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
                    seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
                except grpc.aio.AioRpcError as exc:
                    seen.append(exc.code().name)

        return await serve(running, parse_args("probe", []), Announcement("reward", running.address), Load, log,
                           on_stop=on_stop, ready=ready, poll_s=0.05)

    assert asyncio.run(asyncio.wait_for(service(), 30)) == 0
    assert seen == ["UNAVAILABLE"], seen  # before the fix: ["NOT_SERVING"], the server still answering
