"""Tandem's small shared kernel: what more than one service needs, and nothing else.

- `tandem.rpc`: gRPC server/client bootstrap (auth token, deadlines, health, reflection,
  error mapping).
- `tandem.weight_sync`: the weight-sync wire (group formation, bucket plan, send/receive).
- `tandem.logs`: structlog setup.
- `tandem.membership`: the register/heartbeat loop every service runs.

It is also the public face of the Python API, `from tandem import GRPOTrainer, train`
(coordinator/api.py), imported lazily so that services importing the kernel do not load the
coordinator.
"""

_API = ("GRPOTrainer", "train")


def __getattr__(name: str):
    if name in _API:
        from coordinator import api

        return getattr(api, name)
    raise AttributeError(f"module 'tandem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
