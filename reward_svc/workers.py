"""Worker processes that run scorers off the gRPC event loop, one job each at a time, with a
hard per-job deadline: a worker still busy at its deadline is killed and replaced, so a
pathological item (a power tower math-verify cannot interrupt, a scorer stuck in C code)
costs one item, never a worker for the rest of the run.

concurrent.futures.ProcessPoolExecutor cannot do this: a future that times out leaves its
worker busy, and the pool cannot kill one worker without breaking every other future.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_START_TIMEOUT_S = 120.0  # a fresh worker imports the scorers (sympy) before its first job


class ScorerFailed(Exception):
    """The scorer raised (message: its exception type and text) or its worker died."""


def _serve(conn, initializer: Callable[[], None] | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the service stops its workers itself
    if initializer is not None:
        initializer()
    conn.send("ready")
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the service closed the pool
            return
        try:
            reply = (True, fn(*args))
        except Exception as exc:  # noqa: BLE001 - sent back to the engine, which scores the item 0
            reply = (False, f"{type(exc).__name__}: {exc}")
        conn.send(reply)


class _Worker:
    def __init__(self, context, initializer: Callable[[], None] | None):
        self._conn, child_conn = context.Pipe()
        self.process = context.Process(target=_serve, args=(child_conn, initializer), daemon=True)
        self.process.start()
        child_conn.close()
        self._ready = False

    def wait_ready(self) -> None:
        if not self._ready:
            try:
                started = self._conn.poll(_START_TIMEOUT_S) and self._conn.recv() == "ready"
            except EOFError:
                started = False
            if not started:
                raise ScorerFailed(f"worker {self.process.pid} did not start within {_START_TIMEOUT_S} s "
                                   f"(exit code {self.process.exitcode})")
            self._ready = True

    def call(self, fn: Callable, args: tuple, timeout_s: float) -> tuple[bool, Any]:
        """Blocking (run it in a thread). Raises TimeoutError, EOFError (worker died)."""
        self.wait_ready()
        self._conn.send((fn, args))
        if not self._conn.poll(timeout_s):
            raise TimeoutError
        return self._conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self._conn.close()


_CLOSED = "the reward service is stopping: send the request to another one"


class WorkerPool:
    """`await pool.run(fn, args, timeout_s)`: fn(*args) in a free worker process (fn and args
    picklable). The deadline counts from when a worker takes the job, not from the queue. Once
    closed, a job (waiting or cut off) raises ConnectionError: it is not the item's fault."""

    def __init__(self, num_workers: int, initializer: Callable[[], None] | None = None):
        self._context = multiprocessing.get_context("spawn")
        self._initializer = initializer
        self._workers = [_Worker(self._context, initializer) for _ in range(num_workers)]
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        for worker in self._workers:
            self._idle.put_nowait(worker)
        self._threads = ThreadPoolExecutor(num_workers, thread_name_prefix="reward-worker")
        self.num_replaced = 0
        self._closed = False

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids (replaced workers get new ones)."""
        return [w.process.pid for w in self._workers]

    async def wait_ready(self) -> None:
        """Block until every worker has started and run the initializer."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._threads, w.wait_ready) for w in list(self._workers)))

    async def run(self, fn: Callable, args: tuple, timeout_s: float) -> Any:
        """fn(*args); raises TimeoutError (the worker was killed and replaced), ScorerFailed, or
        ConnectionError (the pool was closed before or during the job)."""
        if self._closed:
            raise ConnectionError(_CLOSED)
        worker = await self._idle.get()
        loop = asyncio.get_running_loop()
        # the thread hands the worker back itself, so a cancelled caller never loses one
        try:
            ok, value = await loop.run_in_executor(self._threads, self._call, worker, fn, args, timeout_s, loop)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            if self._closed:
                raise ConnectionError(_CLOSED) from None
            raise
        if ok:
            return value
        if value is _CLOSED:
            raise ConnectionError(_CLOSED)
        if value is TimeoutError:
            raise TimeoutError(f"scoring took over {timeout_s} s")
        raise ScorerFailed(value)

    def _call(self, worker: _Worker, fn: Callable, args: tuple, timeout_s: float,
              loop: asyncio.AbstractEventLoop) -> tuple[bool, Any]:
        """In a thread: never raises; a worker that timed out or died is replaced."""
        try:
            result = worker.call(fn, args, timeout_s)
        except TimeoutError:
            result = (False, TimeoutError)
        except (EOFError, OSError, ScorerFailed) as exc:
            if self._closed:  # killed by close(): not replaced, and the job is not the item's failure
                return (False, _CLOSED)
            result = (False, f"worker {worker.process.pid} died ({type(exc).__name__}, "
                             f"exit code {worker.process.exitcode})")
        else:
            self._hand_back(worker, loop)
            return result
        worker.kill()
        fresh = _Worker(self._context, self._initializer)
        self._workers[self._workers.index(worker)] = fresh
        self.num_replaced += 1
        self._hand_back(fresh, loop)
        return result

    def _hand_back(self, worker: _Worker, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._idle.put_nowait, worker)
        except RuntimeError:  # the loop is closed: the service is stopping
            pass

    def close(self) -> None:
        self._closed = True
        for worker in self._workers:
            worker.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)
