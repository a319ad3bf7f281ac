"""Health probe for orchestrators (compose healthchecks, scripts): exit 0 when the server at
ADDRESS reports SERVING for the service, 1 otherwise. No token needed: the standard
grpc.health.v1 check is the one call servers accept without it.

    python -m tandem.probe 127.0.0.1:50051 generator     # tandem.generator.v1.GeneratorService
    python -m tandem.probe 127.0.0.1:50051               # the whole server (""): SERVING once all is ready
"""

from __future__ import annotations

import argparse
import sys

from tandem.rpc import check_health

KINDS = ("coordinator", "trainer", "generator", "reward")


def service_name(kind_or_name: str) -> str:
    """A service kind (`generator`) -> its gRPC service name; a full name or "" passes through."""
    if kind_or_name in KINDS:
        return f"tandem.{kind_or_name}.v1.{kind_or_name.capitalize()}Service"
    return kind_or_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.probe", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of the server")
    parser.add_argument("service", nargs="?", default="", help=f"one of {', '.join(KINDS)}, a full service name, "
                                                                 "or nothing for the whole server")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="deadline of the check")
    args = parser.parse_args(argv)
    return 0 if check_health(args.address, service_name(args.service), args.timeout_s) else 1


if __name__ == "__main__":
    sys.exit(main())
