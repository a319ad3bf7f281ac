"""The rollout gateway's HTTP transport: OpenAI's `POST /v1/chat/completions` and
`POST /v1/completions` (no streaming) on FastAPI, served by uvicorn in a thread of the
coordinator, on 127.0.0.1 and an ephemeral port unless told otherwise. The logic is
service.py's; calls run in a thread pool (each waits on a generator over gRPC)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from coordinator.loop.gateway.service import BadRequest, GeneratorUnavailable, RolloutGateway, Unauthorized


def build_app(gateway: RolloutGateway, pool: ThreadPoolExecutor) -> FastAPI:
    app = FastAPI(title="tandem rollout gateway")

    def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)

    async def serve(request: Request, call) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body must be a JSON object", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error")
        if body.get("stream"):
            return error(400, "streaming is not supported by the rollout gateway: set stream=false",
                         "invalid_request_error")
        authorization = request.headers.get("authorization")
        try:
            result = await asyncio.get_running_loop().run_in_executor(pool, call, authorization, body)
        except Unauthorized as exc:
            return error(401, str(exc), "invalid_request_error", "invalid_api_key")
        except BadRequest as exc:
            return error(400, str(exc), "invalid_request_error")
        except GeneratorUnavailable as exc:
            return error(503, str(exc), "server_error", "generator_unavailable")
        return JSONResponse(result)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        return await serve(request, gateway.chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        return await serve(request, gateway.completions)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": gateway.defaults.model, "object": "model",
                                                         "owned_by": "tandem"}]})

    return app


class GatewayServer:
    """`RolloutGateway` over HTTP in a background thread; `url` is its OpenAI base URL (…/v1)."""

    def __init__(self, gateway: RolloutGateway, *, host: str = "127.0.0.1", port: int = 0, workers: int = 64):
        self.gateway = gateway
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gateway")
        config = uvicorn.Config(build_app(gateway, self._pool), host=host, port=port, log_level="warning",
                                access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway-http", daemon=True)
        self.host = host
        self.port = 0

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the rollout gateway did not start on {self.host} within {timeout_s} s")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
