"""tandem/stores.py: a store listens where it is told only, and a client without the run's
token (a torch TCPStore client or a raw socket) neither reads nor plants the run's keys."""

from __future__ import annotations

import datetime
import ipaddress
import multiprocessing as mp
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.stores import (
    SealedStore,
    StoreTampered,
    is_loopback,
    loopback_collectives_env,
    serve_store,
)
from tandem.weight_sync import (
    GroupSpec,
    WeightReceiver,
    WeightSender,
    iter_plan_tensors,
    plan_for_state_dict,
)

TOKEN = "run-token"


def listeners(port: int) -> list[str]:
    """Addresses listening on `port` (IPv4 and IPv6 tables)."""
    found = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # /proc prints host-order words
                found.append(str(ipaddress.ip_address(words)))
    return found


def _client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))


def test_serve_store_listens_on_the_given_address_only():
    torch_default = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert listeners(torch_default.port) == ["::"]  # what torch does with the same host: every interface
    store = serve_store("127.0.0.1")
    assert listeners(store.port) == ["127.0.0.1"]
    _client(store.port).set("k", b"v")  # and it answers there
    assert store.get("k") == b"v"


def test_serve_store_refuses_an_address_of_another_host():
    with pytest.raises(OSError, match="is '192.0.2.123' an address of this host"):
        serve_store("192.0.2.123")


def test_a_client_without_the_token_sees_no_key_and_no_value():
    server = serve_store("127.0.0.1")
    sealed = SealedStore(server, TOKEN, "test")
    sealed.set("weights/3-epochsecret/rank_1", b"127.0.0.1:41234 seq 7")
    intruder = _client(server.port)
    names = intruder.list_keys()
    assert len(names) == 1 and names[0].startswith("sealed/") and "epochsecret" not in names[0]
    value = intruder.get(names[0])
    assert b"127.0.0.1" not in value and b"41234" not in value
    assert sealed.get("weights/3-epochsecret/rank_1") == b"127.0.0.1:41234 seq 7"
    # an unsealed client of the same store does see everything: what sealing takes away
    _client(server.port).set("weights/3-epochsecret/rank_2", b"127.0.0.1:5000")
    assert "weights/3-epochsecret/rank_2" in intruder.list_keys()


def test_values_planted_without_the_token_are_refused():
    server = serve_store("127.0.0.1")
    sealed = SealedStore(server, TOKEN, "test")
    sealed.set("addr", b"127.0.0.1:1")
    sealed.set("other", b"127.0.0.1:2")
    intruder = _client(server.port)
    name = sealed.name("addr")
    intruder.set(name, b"10.0.0.66:6666")  # a forged value
    with pytest.raises(StoreTampered, match="without this run's token"):
        sealed.get("addr")
    intruder.set(name, intruder.get(sealed.name("other")))  # a genuine value moved from another key
    with pytest.raises(StoreTampered):
        sealed.get("addr")
    with pytest.raises(StoreTampered):  # another run's token, or another purpose, is not this one
        SealedStore(server, "another-token", "test").unseal(sealed.name("other"), server.get(sealed.name("other")))


def test_a_raw_socket_speaking_nonsense_does_not_take_the_store_down():
    server = serve_store("127.0.0.1")
    sealed = SealedStore(server, TOKEN, "test")
    for payload in (b"", b"\x00" * 64, b"GET / HTTP/1.0\r\n\r\n", bytes(range(256)) * 64):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(payload)
    sealed.set("still", b"serving")
    assert SealedStore(_client(server.port), TOKEN, "test").get("still") == b"serving"


def test_loopback_detection_and_environment():
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.0.2.1", "10.0.0.1", "example.com", ""]))
    assert loopback_collectives_env("127.0.0.1")["GLOO_SOCKET_IFNAME"] == "lo"
    assert loopback_collectives_env("0.0.0.0") == {}


def _receive(address: str, secret: str | None, plan, queue) -> None:
    try:
        state = WeightReceiver(secret=secret).receive(GroupSpec(address, 1, "epoch", 2, op_timeout_s=8), 1, 1, plan)
        queue.put({k: v.numpy().copy() for k, v in state.items()})
    except Exception as exc:  # noqa: BLE001 - sent back to the test
        queue.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("receiver_secret", [TOKEN, "not-the-run-token"])
def test_weight_sync_over_a_sealed_store_needs_the_token_on_both_sides(receiver_secret):
    state = {"w": torch.randn(8, 3), "b": torch.randn(4)}
    plan = plan_for_state_dict(state, bucket_bytes=64)
    sender = WeightSender(secret=TOKEN)
    assert listeners(int(sender.address.rpartition(":")[2])) == ["127.0.0.1"]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(sender.address, receiver_secret, plan, queue))
    receiver.start()
    spec = GroupSpec(sender.address, 1, "epoch", 2, op_timeout_s=8)
    try:
        sender.send(spec, 1, plan, iter_plan_tensors(plan, state))
        sent = True
    except Exception:  # noqa: BLE001 - a receiver without the token never joins: the send times out
        sent = False
    got = queue.get(timeout=60)
    receiver.join(timeout=30)
    sender.close()
    if receiver_secret == TOKEN:
        assert sent and all(torch.equal(torch.from_numpy(got[k]), state[k]) for k in state)
    else:
        assert not sent and isinstance(got, str) and ("StoreTampered" in got or "imeout" in got), got
