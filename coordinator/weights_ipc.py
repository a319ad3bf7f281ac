"""Colocated publishing on GPUs: the trainer exports the version as CUDA IPC handles of its
buckets (TrainerClient.export_cuda_ipc), every generator reads them in place and swaps them in
atomically (GeneratorClient.load_cuda_ipc_weights), and the trainer frees the buckets once all
generators have answered, whether they succeeded or not (torch's IPC reference counts keep a
block from reuse while a generator that gave up late still holds it)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tandem.weight_sync import BucketPlan


def publish_cuda_ipc(trainer, generators: list, version: int, plan: BucketPlan, timeout_s: float,
                     log) -> tuple[int, float]:
    """Send `version` to `generators` (GeneratorHandle list); returns (bytes exported, seconds).
    Raises the first generator's error after every generator has answered."""
    start = time.perf_counter()
    export = trainer.export_cuda_ipc(version)
    try:
        with ThreadPoolExecutor(len(generators)) as pool:
            loads = [pool.submit(g.client.load_cuda_ipc_weights, export.buckets, plan, version, timeout_s)
                     for g in generators]
            failure = next((e for e in [f.exception() for f in loads] if e is not None), None)
    finally:
        trainer.release_cuda_ipc(version)
    if failure is not None:
        raise failure
    duration = time.perf_counter() - start
    log.info("weights_published", version=version, cuda_ipc=True, generators=len(generators),
             bytes=export.num_bytes, seconds=round(duration, 3))
    return export.num_bytes, duration
