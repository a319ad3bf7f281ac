"""One entry point for every service that someone other than `tandem run` starts: the
containers of compose.yaml, or services on several hosts.

    python -m coordinator.cli.container coordinator            # tandem run with cluster.launch=external
    python -m coordinator.cli.container trainer [--nnodes 2 --node-rank 0 --rdzv-endpoint HOST:PORT]
    python -m coordinator.cli.container generator
    python -m coordinator.cli.container reward --task arithmetic

Every one reads the same experiment: TANDEM_CONFIG (a YAML path, optional) and
TANDEM_OVERRIDES (dotted overrides separated by spaces), plus any overrides after `--`.
The coordinator runs it with `cluster.launch=external`; every other service writes its own
settings from that config with coordinator/launch/specs.py's functions (so a compose run and a
local run start identical services), then replaces itself with the service, which binds all
interfaces and advertises the address this host reaches the coordinator from.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import tempfile
import zlib
from pathlib import Path

from tandem.torchrun import torchrun_head

ROLES = ("coordinator", "trainer", "generator", "reward")
DEFAULT_PORT = 50051


def experiment_args(extra: list[str]) -> tuple[str | None, list[str]]:
    """(config path or None, overrides) from TANDEM_CONFIG / TANDEM_OVERRIDES and `extra`."""
    return os.environ.get("TANDEM_CONFIG") or None, shlex.split(os.environ.get("TANDEM_OVERRIDES", "")) + extra


def reaching_address(coordinator: str) -> str:
    """This host's address on the interface that routes to the coordinator (what others can reach)."""
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"--coordinator must be HOST:PORT, got {coordinator!r}")
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        raise SystemExit(f"cannot resolve the coordinator's host {host!r} ({exc}): check --coordinator "
                         "(or TANDEM_COORDINATOR)") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, int(port)))  # UDP connect: picks the route, sends nothing
        return probe.getsockname()[0]


def coordinator_argv(config: str | None, overrides: list[str], host: str, port: int) -> list[str]:
    """`tandem run` arguments: bind host:port, wait up to an hour for the services (started by someone
    else, maybe on a busy or distant host), launch nothing; the experiment's overrides may say otherwise."""
    return ["run", *([config] if config else []), f"cluster.host={host}", f"cluster.port={port}",
            "cluster.startup_timeout_s=3600", *overrides, "cluster.launch=external"]


def service_argv(args: argparse.Namespace, config: str | None, overrides: list[str], settings_dir: Path) -> list[str]:
    """The command that serves `args.role`, its settings file written into settings_dir."""
    from coordinator.config import ConfigError, load_config
    from coordinator.launch import specs as launch
    from coordinator.launch.launcher import python_module

    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    advertise = args.advertise_host or reaching_address(args.coordinator)
    common = ["--host", args.host, "--port", str(args.port), "--advertise-host", advertise,
              "--coordinator", args.coordinator]
    path = settings_dir / f"{args.role}.json"
    if args.role == "trainer":
        settings = launch.trainer_settings(cfg, model_dir(cfg)).model_copy(update={"weight_sync_host": advertise})
        path.write_text(settings.model_dump_json())
        return [*torchrun(args, cfg.cluster.trainer_ranks), "-m", "trainer_svc", "--settings", str(path), *common]
    if args.role == "generator":
        index = args.index if args.index is not None else zlib.crc32(advertise.encode()) % 10_000  # replicas differ
        settings = launch.generator_settings(cfg, model_dir(cfg), index, launch.scratch_root(settings_dir))
        path.write_text(settings.model_dump_json())
        return python_module("generator_svc", "--settings", str(path), *common)
    if args.task not in cfg.env:
        raise SystemExit(f"--task {args.task!r} is not a task of the experiment: choose one of {sorted(cfg.env)}")
    path.write_text(launch.reward_settings(cfg, args.task).model_dump_json())
    return python_module("reward_svc", "--settings", str(path), *common)


def model_dir(cfg) -> str:
    """policy.model_name, or the embedded tiny model (built once into the shared cache)."""
    if cfg.policy.model_name is not None:
        return cfg.policy.model_name
    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model(cache_root()))


def torchrun(args: argparse.Namespace, ranks: int) -> list[str]:
    """torchrun on one host (no listener of its own: tandem/torchrun.py) or one node of a
    multi-node c10d rendezvous."""
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise SystemExit("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
    local_addr = (args.advertise_host or reaching_address(args.coordinator)) if args.nnodes > 1 else "127.0.0.1"
    return torchrun_head(args.ranks or ranks, nnodes=args.nnodes, node_rank=args.node_rank,
                         rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, local_addr=local_addr)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m coordinator.cli.container", description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--coordinator", default=os.environ.get("TANDEM_COORDINATOR", f"coordinator:{DEFAULT_PORT}"),
                        help="HOST:PORT of the coordinator (env TANDEM_COORDINATOR)")
    parser.add_argument("--host", default="0.0.0.0", help="address this service binds (default: all interfaces "
                                                          "of its container or host)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port this service binds (0: any free port)")
    parser.add_argument("--advertise-host", default=None, help="address others reach this service at "
                                                                "(default: this host's address towards the coordinator)")
    parser.add_argument("--task", default=None, help="reward: the env.<task> this service scores")
    parser.add_argument("--index", type=int, default=None, help="generator: its seed is grpo.seed + index "
                                                                 "(default: derived from its address)")
    parser.add_argument("--ranks", type=int, default=0, help="trainer: processes on this node (0: cluster.trainer_ranks)")
    parser.add_argument("--nnodes", type=int, default=1, help="trainer: nodes of the torchrun rendezvous")
    parser.add_argument("--node-rank", type=int, default=0, help="trainer: this node's rank (0 serves gRPC)")
    parser.add_argument("--rdzv-endpoint", default=None, help="trainer: HOST:PORT of the c10d rendezvous")
    parser.add_argument("--rdzv-id", default="tandem", help="trainer: rendezvous id, the same on every node")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.role == "reward" and not args.task:
        parser.error("reward needs --task TASK (one env.<task> of the experiment)")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    config, overrides = experiment_args(extra)
    if args.role == "coordinator":
        from coordinator.cli.main import main as tandem

        return tandem(coordinator_argv(config, overrides, args.host, args.port))
    settings_dir = Path(tempfile.mkdtemp(prefix=f"tandem-{args.role}-"))
    command = service_argv(args, config, overrides, settings_dir)
    from tandem.logs import configure_logging

    configure_logging(args.role).info("exec", command=shlex.join(command))  # a JSON line like the service's own
    sys.stderr.flush()
    os.execv(command[0], command)  # the service replaces this process: signals reach it directly


if __name__ == "__main__":
    sys.exit(main())
