"""Where the coordinator listens when its port is taken (coordinator/launch/local.py), with a real
listener holding the port: a local launch moves to another port (it starts the services itself and
tells them the new address); an external launch (Slurm, compose, hosts) stops with one error, since
its services look for the coordinator at the configured address."""

import socket

import pytest
import structlog

from coordinator.config import load_config
from coordinator.launch.local import AddressTaken, LocalCluster


@pytest.fixture
def held_port():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def _cluster(tmp_path, port: int, launch: str) -> LocalCluster:
    cfg = load_config(None, [f"cluster.port={port}", f"cluster.launch={launch}", "cluster.host=127.0.0.1"])
    return LocalCluster(cfg, "unused-model", tmp_path, "token", structlog.get_logger())


def test_an_external_launch_whose_port_is_taken_stops_naming_it(tmp_path, held_port):
    cluster = _cluster(tmp_path, held_port, "external")
    with pytest.raises(AddressTaken, match=f"127.0.0.1:{held_port}.*taken.*cluster.port"):
        cluster._serve()


def test_a_local_launch_whose_port_is_taken_moves_to_a_free_one(tmp_path, held_port):
    cluster = _cluster(tmp_path, held_port, "local")
    address = cluster._serve()
    try:
        assert address.rpartition(":")[2] != str(held_port)
    finally:
        cluster.server.stop()
