"""Entry point, run by torchrun on every rank:

    torchrun --nproc-per-node N [tandem/torchrun.py's rendezvous options] -m trainer_svc --settings trainer.json \\
        [--host H] [--port P] [--coordinator HOST:PORT] [--address-file PATH]

Rank 0 serves gRPC and drives the others; ranks > 0 follow its commands until it stops.
"""

from __future__ import annotations

import asyncio
import os
import signal

from tandem import service
from tandem.logs import configure_logging
from tandem.process_logs import exit_now
from tandem.rpc import TokenMissing, load_token
from trainer_svc.config import TrainerSettings


def main(argv: list[str] | None = None) -> None:
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

    from trainer_svc.engine import build_engine  # torch and transformers load after the arguments are checked

    engine = build_engine(settings, log, token)
    if engine.is_leader:
        from trainer_svc.server import serve

        try:
            code = asyncio.run(serve(engine, settings, args, token, log))
        finally:
            engine.close()
    else:
        # torchrun signals every rank; the followers keep running until rank 0 (signalled too)
        # has stopped serving and sends Shutdown, so nothing is cut off mid-collective.
        signal.signal(signal.SIGTERM, lambda *_: log.info("sigterm_waiting_for_rank0"))
        signal.signal(signal.SIGINT, lambda *_: log.info("sigint_waiting_for_rank0"))
        engine.follow()
        engine.close()
        code = 0
    exit_now(code)  # all work is done and saved: skip the interpreter's teardown of torch's heap


if __name__ == "__main__":
    main()
