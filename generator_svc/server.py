"""The generator service's serve loop: the contract's servicer (tandem/generation/servicer.py)
over a vLLM engine.

The server listens (health NOT_SERVING) while the engine loads, so probes get an answer;
it turns SERVING once the engine is up, and NOT_SERVING again if a weight update leaves
the weights in an unknown state (until a later update succeeds).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from generator_svc.config import GeneratorSettings
from tandem import service
from tandem.generation.engine import GenerationEngine
from tandem.generation.servicer import SERVICE_NAME, GeneratorServicer, add_to_server
from tandem.kinds import ServiceKind
from tandem.membership import Announcement, Load
from tandem.rpc import start_server


def _load(engine: GenerationEngine) -> Load:
    """Heartbeat load: sequences in flight and the weight version served."""
    info = engine.info()
    return Load(num_inflight=info.num_running, weight_version=info.weight_version)


async def serve(settings: GeneratorSettings, args: argparse.Namespace, token: str, log: Any) -> int:
    """Listen (NOT_SERVING) while the engine loads, then serve until SIGTERM/SIGINT (exit code 0,
    after draining: leave the coordinator's rotation, finish the calls in flight) or engine
    death (1); the lifecycle is tandem.service.serve's."""
    from generator_svc.engines.vllm_engine import VllmEngine  # imports vLLM: after the env is set

    servicer = GeneratorServicer(log)
    running = servicer.running = await start_server(
        [lambda s: add_to_server(servicer, s)], [SERVICE_NAME],
        host=args.host, port=args.port, token=token, log=log)

    async def load_engine() -> None:
        started = time.monotonic()
        servicer.engine = await VllmEngine.start(settings, log)
        log.info("engine_loaded", seconds=round(time.monotonic() - started, 1), model=settings.model_name)

    async def close_engine() -> None:
        if servicer.engine is not None:
            await servicer.engine.close()

    async def drain_engine() -> None:  # SIGTERM: finish (or hand back) the requests in flight
        if servicer.engine is not None:
            await servicer.engine.drain(settings.drain_timeout_s)

    kind = ServiceKind.TEACHER if settings.teacher else ServiceKind.GENERATOR
    announcement = Announcement(kind=kind, address=f"{args.advertise_host or args.host}:{running.port}",
                                capacity=settings.max_num_seqs)
    return await service.serve(running, args, announcement, lambda: _load(servicer.engine), log,
                               on_stop=close_engine, ready=load_engine, drain=drain_engine,
                               dead=lambda: servicer.engine is not None and servicer.engine.dead)
