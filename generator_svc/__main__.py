"""`python -m generator_svc --settings generator.json`: parse, set vLLM's environment, serve, stop.

The `__main__` guard is required: vLLM starts its engine processes with spawn, which
re-imports the main module.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m generator_svc", description=__doc__)
    parser.add_argument("--settings", type=Path, required=True, help="JSON file of GeneratorSettings")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument("--coordinator", default=None, help="host:port of the coordinator to register with")
    parser.add_argument("--address-file", type=Path, default=None,
                        help="once serving, the bound host:port is written here (atomically)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from generator_svc.config import load_settings, run_dir, vllm_environment
    from tandem.rpc import TokenMissing, load_token

    settings = load_settings(args.settings)
    try:
        token = load_token()
    except TokenMissing as exc:
        raise SystemExit(f"generator_svc: {exc}") from None
    scratch = run_dir(settings, os.getpid())
    scratch.mkdir(parents=True, exist_ok=True)
    os.environ.update(vllm_environment(settings, dict(os.environ), scratch))  # before vLLM is imported

    from generator_svc.server import serve
    from tandem.logs import configure_logging

    log = configure_logging("generator")
    log.info("settings", **settings.model_dump(mode="json"))
    try:
        code = asyncio.run(serve(settings, host=args.host, port=args.port, token=token,
                                 coordinator=args.coordinator, address_file=args.address_file, log=log))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
