"""What a live single-host run listens on, and what a client without the run's token gets from
its stores: a trainer of 2 torchrun ranks, a vLLM generator and a reward service started by
LocalCluster (as `tandem run` does), after a weight publish (so the weight-sync group exists).

Every listening TCP socket of the run's processes (this process, which serves the
coordinator, and all its descendants) must be on loopback; the weight-sync store and the
trainer's default-group store must show such a client only sealed names and values, and the
run must go on publishing after it connected and spoke nonsense to them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from pathlib import Path

import pytest
import torch.distributed as dist

from coordinator.config import load_config
from tandem.stores import SealedStore
from tests import procs

pytestmark = pytest.mark.integration


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _listening_sockets() -> dict[str, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket of this host's network namespace."""
    table = {}
    for name, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            table[fields[9]] = (str(ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4)))),
                                int(port, 16))
    return table


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def _run_listeners() -> list[tuple[int, str, str, int]]:
    """(pid, command, address, port) of every socket the run's processes listen on."""
    table = _listening_sockets()
    found = []
    for pid in _descendants(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        found += [(pid, command, *table[inode]) for inode in _socket_inodes(pid) if inode in table]
    return found


def _rank0_store() -> tuple[str, int]:
    """MASTER_ADDR, MASTER_PORT of the trainer's rank 0 (the default group's store)."""
    for pid in _descendants(os.getpid()):
        try:
            env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        except OSError:
            continue
        if env.get("RANK") == "0" and "trainer_svc" in Path(f"/proc/{pid}/cmdline").read_text():
            return env["MASTER_ADDR"], int(env["MASTER_PORT"])
    raise AssertionError("no trainer rank 0 among the run's processes")


@pytest.fixture(scope="module")
def run(tmp_path_factory, start_loop):
    root = tmp_path_factory.mktemp("listeners")
    cfg = load_config(overrides=["cluster.num_generators=1", "cluster.trainer_ranks=2", f"logger.log_dir={root}",
                                 "logger.tensorboard_enabled=false", "grpo.num_prompts_per_step=16"])
    with start_loop(root, cfg, num_train=200) as (ctx, _):
        assert ctx.publish().epoch >= 0  # the weight-sync group of trainer rank 0 and the generator exists
        yield ctx, _run_listeners()


def test_every_listener_of_the_run_is_on_loopback(run):
    _, listeners = run
    outside = [entry for entry in listeners if not _is_loopback(entry[2])]
    assert outside == [], "\n".join(map(str, outside))
    commands = " ".join(command for _, command, _, _ in listeners)
    # non-vacuous: the coordinator (this process), both trainer ranks, the generator's vLLM worker and the reward
    # service listen (gRPC, the two stores, gloo's pairs)
    assert len(listeners) >= 8 and all(kind in commands for kind in ("trainer_svc", "generator_svc", "reward_svc"))
    assert not [entry for entry in listeners if "torch.distributed.run" in entry[1]], "torchrun's agent listens"


def test_a_client_without_the_token_gets_nothing_from_the_stores(run):
    ctx, _ = run
    weight_sync = ctx.services.trainer.info().weight_sync_store_address
    host, _, port = weight_sync.rpartition(":")
    stores = {"weight-sync": (host, int(port)), "default-group": _rank0_store()}
    for name, (host, port) in stores.items():
        intruder = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
        keys = intruder.list_keys()
        assert keys and all(k.startswith("sealed/") for k in keys), (name, keys)
        for key in keys:
            value = intruder.get(key)
            assert b"127.0.0.1" not in value and b"weights/" not in value, (name, key, value[:80])
        for payload in (b"\x00" * 32, b"GET / HTTP/1.0\r\n\r\n"):  # a raw client speaking nonsense
            with socket.create_connection((host, port), timeout=5) as raw:
                raw.sendall(payload)
    member = SealedStore(dist.TCPStore(*stores["weight-sync"], is_master=False), procs.TOKEN, "weight-sync")
    member.set("still-serving", b"yes")  # the store still serves the run's processes
    assert member.get("still-serving") == b"yes"
    version = ctx.publisher.version
    report = ctx.publish()  # and the run goes on
    assert ctx.publisher.version == version + 1 and report.bytes_sent > 0
