"""torch.distributed stores that listen only where they are told and keep the run's keys from
clients without the run's token.

torch's TCPStore (2.13) has no authentication, lists every key to any client (`list_keys`),
and its server binds every interface ([::], dual stack) whatever host it is given. So:

- `serve_store(host, port)` hands the server a socket already bound to `host`
  (`master_listen_fd`): 127.0.0.1 on one host, the configured or advertised address on
  several. Nothing off the host reaches a store bound to loopback.
- `SealedStore(store, secret, purpose)` is what the run's processes use on top of it: each key
  is stored under HMAC-SHA256(secret, key) and each value encrypted (HMAC-SHA256 in counter
  mode) and authenticated (encrypt-then-MAC, bound to the key's name) with keys derived from
  the secret (the run's token) and `purpose`. A client without the secret (another local user
  on loopback, anyone on the network when bound to an interface) can connect, list opaque
  names and read ciphertext, but learns no key, address or epoch secret, and a value it writes
  fails authentication where a member reads it: `StoreTampered`, never a use of the value.
  What such a client still can do is deny service: delete or overwrite keys (the group being
  formed fails; the caller retries), bump `add` counters (their values are plain), fill the
  store or hold connections open.

What neither covers: the data connections of the groups themselves (gloo pairs, NCCL), which
carry no authentication of their own; they listen on the interface their store's address
names (loopback on one host).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import socket
import struct

import torch.distributed as dist

_NONCE_BYTES = 16
_TAG_BYTES = 32
_LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


class StoreTampered(RuntimeError):
    """A store value failed authentication: written by a client without the run's token."""


def is_loopback(host: str) -> bool:
    """Whether `host` names this host's loopback (127.0.0.0/8, ::1, localhost)."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return socket.inet_pton(socket.AF_INET, host)[0] == 127
    except OSError:
        pass
    try:
        return socket.inet_pton(socket.AF_INET6, host) == socket.inet_pton(socket.AF_INET6, "::1")
    except OSError:
        return False


def loopback_collectives_env(host: str) -> dict[str, str]:
    """Environment that keeps gloo's and NCCL's sockets on the loopback interface when `host`
    (the address a service or store binds) is loopback: both otherwise pick the interface
    the machine's host name resolves to, often a LAN address. Empty otherwise."""
    if not is_loopback(host) or "lo" not in {name for _, name in socket.if_nameindex()}:
        return {}
    return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}


def listening_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to host:port (host as given: one address, or 0.0.0.0 / :: for every
    interface when that is what is configured), listening."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except OSError as exc:
        raise OSError(f"cannot resolve the store's bind address {host!r}: {exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"the store cannot listen on {host}:{port}: {exc.strerror} (is {host!r} an "
                                 "address of this host?)") from None
    return sock


def serve_store(host: str, port: int = 0, timeout_s: float = 60.0) -> dist.TCPStore:
    """A TCPStore server listening on host:port only (port 0: any free one, read `.port`)."""
    sock = listening_socket(host, port)
    store = dist.TCPStore(host, sock.getsockname()[1], is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=sock.detach())
    return store


def derive_secret(token: str, purpose: str) -> bytes:
    """A key for one store's sealing, from the run's token (distinct per purpose)."""
    return hmac.new(token.encode(), b"tandem-store/" + purpose.encode(), hashlib.sha256).digest()


class SealedStore(dist.Store):
    """`store` as seen by the run's processes: names and values sealed with `secret` (module
    docstring). Both sides of a rendezvous must wrap the same store with the same secret and
    purpose. compare_set is refused (a sealed value cannot be compared by the server)."""

    def __init__(self, store: dist.Store, secret: str, purpose: str):
        super().__init__()
        self.inner = store
        master = derive_secret(secret, purpose)
        self._name_key = hmac.new(master, b"name", hashlib.sha256).digest()
        self._enc_key = hmac.new(master, b"encrypt", hashlib.sha256).digest()
        self._mac_key = hmac.new(master, b"authenticate", hashlib.sha256).digest()

    def name(self, key: str) -> str:
        """The name `key` is stored under."""
        return "sealed/" + hmac.new(self._name_key, key.encode(), hashlib.sha256).hexdigest()

    def seal(self, name: str, value: bytes) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        body = bytes(a ^ b for a, b in zip(value, self._keystream(nonce, len(value))))
        return nonce + body + self._tag(name, nonce, body)

    def unseal(self, name: str, sealed: bytes) -> bytes:
        nonce, body, tag = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:-_TAG_BYTES], sealed[-_TAG_BYTES:]
        if len(sealed) < _NONCE_BYTES + _TAG_BYTES or not hmac.compare_digest(tag, self._tag(name, nonce, body)):
            raise StoreTampered(f"store value under {name} failed authentication: it was written by a client "
                                "without this run's token (or with another run's)")
        return bytes(a ^ b for a, b in zip(body, self._keystream(nonce, len(body))))

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        blocks = (hmac.new(self._enc_key, nonce + struct.pack(">Q", i), hashlib.sha256).digest()
                  for i in range((length + 31) // 32))
        return b"".join(blocks)[:length]

    def _tag(self, name: str, nonce: bytes, body: bytes) -> bytes:
        return hmac.new(self._mac_key, name.encode() + b"\0" + nonce + body, hashlib.sha256).digest()

    # -- the dist.Store interface (what gloo, NCCL and torch's group creation call) --
    def set(self, key: str, value) -> None:
        name = self.name(key)
        self.inner.set(name, self.seal(name, _as_bytes(value)))

    def get(self, key: str) -> bytes:
        name = self.name(key)
        return self.unseal(name, self.inner.get(name))

    def add(self, key: str, value: int) -> int:
        return self.inner.add(self.name(key), value)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check([self.name(k) for k in keys])

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        names = [self.name(k) for k in keys]
        if timeout is None:
            self.inner.wait(names)
        else:
            self.inner.wait(names, timeout)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(self.name(key))

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.inner.set_timeout(timeout)

    def compare_set(self, key: str, expected, desired) -> bytes:
        raise NotImplementedError("SealedStore cannot compare_set: the server only sees sealed values")


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
