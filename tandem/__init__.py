"""Tandem's small shared kernel: what more than one service needs, and nothing else.

- `tandem.rpc`: gRPC server/client bootstrap (auth token, deadlines, health, reflection,
  error mapping).
- `tandem.weight_sync`: the weight-sync wire (group formation, bucket plan, send/receive).
- `tandem.logs`: structlog setup.
- `tandem.membership`: the register/heartbeat loop every service runs.

The kernel imports nothing above it: the Python API is `coordinator.api` (`from coordinator.api
import GRPOTrainer, train`) and the `tandem` command `coordinator.cli.main`.
"""
