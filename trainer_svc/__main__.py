"""Entry point, run by torchrun on every rank:

    torchrun --nproc-per-node N [tandem/torchrun.py's rendezvous options] -m trainer_svc --settings trainer.json \\
        [--host H] [--port P] [--coordinator HOST:PORT] [--address-file PATH]

Rank 0 serves gRPC and drives the others; ranks > 0 follow its commands until it stops.
"""

from __future__ import annotations

import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor

from tandem import service
from tandem.logs import configure_logging
from tandem.process_logs import exit_now
from tandem.rpc import TokenMissing, load_token
from tandem.torchrun import die_with_agent
from trainer_svc.config import TrainerSettings


def main(argv: list[str] | None = None) -> None:
    die_with_agent()  # an orphaned rank must not serve beside the relaunched trainer
    args = service.parse_args("Tandem trainer service (run under torchrun)", argv)
    if args.settings is None:
        raise SystemExit("--settings PATH is required (a JSON file of trainer_svc.config.TrainerSettings)")
    settings = service.load_settings(args.settings, TrainerSettings)
    try:
        token = load_token()
    except TokenMissing as exc:
        raise SystemExit(f"trainer_svc: {exc}") from None
    log = configure_logging("trainer_svc", route_all=True).bind(rank=int(os.environ.get("RANK", "0")))
    log.info("settings", **settings.model_dump(mode="json"))

    leader = int(os.environ.get("RANK", "0")) == 0  # torchrun's; a plain `python -m trainer_svc` is a world of one
    code = _lead(settings, args, token, log) if leader else _follow(settings, token, log)
    exit_now(code)  # all work is done and saved: skip the interpreter's teardown of torch's heap


def _lead(settings: TrainerSettings, args, token: str, log) -> int:
    """Rank 0: serve gRPC on the main thread (asyncio) and do every piece of torch work, from
    loading the model to closing it, on one engine thread. One thread, because each thread that
    runs torch ops gets an OpenMP team of its own: with two teams the process holds more OpenMP
    threads than the machine has cores, libgomp stops spinning between parallel regions, and the
    tiny model's train step took 1.5x as long (0.14 -> 0.21 s, benchmarks/thread_teams.py)."""
    from trainer_svc.engine import build_engine  # torch and transformers load after the arguments are checked
    from trainer_svc.server import serve

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-engine") as compute:
        engine = compute.submit(build_engine, settings, log, token).result()
        try:
            return asyncio.run(serve(engine, settings, args, token, log, compute))
        finally:
            compute.submit(engine.close).result()


def _follow(settings: TrainerSettings, token: str, log) -> int:
    """Ranks > 0: run rank 0's commands on the main thread until it stops."""
    from trainer_svc.engine import build_engine

    engine = build_engine(settings, log, token)
    # torchrun signals every rank; the followers keep running until rank 0 (signalled too)
    # has stopped serving and sends Shutdown, so nothing is cut off mid-collective.
    signal.signal(signal.SIGTERM, lambda *_: log.info("sigterm_waiting_for_rank0"))
    signal.signal(signal.SIGINT, lambda *_: log.info("sigint_waiting_for_rank0"))
    engine.follow()
    engine.close()
    return 0


if __name__ == "__main__":
    main()
