"""Weights to the generators: transports (transports.py: collective, shared memory, CUDA IPC),
publishing with retries and admission (publisher.py), and colocated generators' sleep and wake
around the trainer's work (phases.py)."""
