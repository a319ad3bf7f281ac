"""vLLM's engine process exits when the generator dies, however the generator dies.

vLLM 0.32 runs its engine (`EngineCore`) in a child process that only the generator ever stops:
`AsyncLLM.shutdown` (or its finalizer) sends SIGTERM, then SIGKILL. Nothing in the engine
process watches for its parent: it waits for requests on ZMQ sockets, and ZMQ hides a peer that
went away (it waits to reconnect). So a generator killed alone (kill -9, the OOM killer, a
SIGKILL by pid) leaves its engine running for good, holding its memory (its device memory on a
GPU). vLLM's workers (tensor or pipeline parallel) are children of the engine process with a
death pipe to it: they stop when the engine does, so the engine is the one to watch from.

Here a thread in the engine process waits for the generator to exit (a pidfd: woken once, at
its exit; never mistaken for a later process given the same pid, since the fd is opened while
the generator is still this process's parent), then SIGKILLs vLLM's workers and the engine
process itself. It is started by the executor (`executor_exiting_with_parent`), the first Tandem
code vLLM runs in the engine process whatever executor it uses (the worker extension runs in
the workers, which tensor or pipeline parallel puts in processes of their own).

A kill, not vLLM's own shutdown (SIGTERM): with its client gone the engine has no one to answer,
and its teardown only frees what the process's exit frees (on a GPU the driver releases device
memory at exit; the shared memory vLLM makes through multiprocessing is unlinked by its resource
tracker, which is not killed). That teardown is also slow, and holds the GIL while it un-freezes vLLM's heap and
collects it (seconds on CPU): a SIGTERM-first version, with this kill 5 s later as a fallback,
let a spawned engine on a loaded machine run 18 s after the generator's death (a kill from a
Python thread waits for the GIL too).

Not PR_SET_PDEATHSIG in the engine process: its signal follows the death of the parent
*thread* that started the child, and vLLM starts the engine from the thread that builds it
(`asyncio.to_thread` in VllmEngine.start): a build moved to a short-lived thread would kill the
engine at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import threading
import time

from vllm.v1.executor.multiproc_executor import MultiprocExecutor
from vllm.v1.executor.uniproc_executor import UniProcExecutor

_log = logging.getLogger(__name__)


def exit_with_parent() -> None:
    """Make this process and its own multiprocessing children (vLLM's workers) die when its parent
    exits, as the module docstring says; nothing where this process was not started by
    multiprocessing (no parent to watch)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_after, args=(parent.pid,), daemon=True, name="TandemExitWithParent").start()


def _exit_after(parent_pid: int) -> None:
    _wait_for_exit(parent_pid)
    _log.warning("the generator (pid %d) is gone: its vLLM engine process exits", parent_pid)
    for child in multiprocessing.active_children():  # vLLM's workers (tensor/pipeline parallel)
        child.kill()
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_exit(parent_pid: int) -> None:
    """Return once process `parent_pid`, this process's parent when it started, has exited."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except OSError:  # gone already (no such process), or a kernel older than Linux 5.3: look once a second
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        return
    try:
        if os.getppid() == parent_pid:  # still the parent, so the fd is of it (not of a reused pid)
            select.select([pidfd], [], [])  # readable once it has exited
    finally:
        os.close(pidfd)


class _ExitsWithParent:
    """Starts the watch as the engine process builds its executor, before the model is loaded."""

    def _init_executor(self) -> None:
        exit_with_parent()
        super()._init_executor()


class UniProcExecutorExitingWithParent(_ExitsWithParent, UniProcExecutor):
    """vLLM's UniProcExecutor (the model in the engine process) in an engine that exits with the generator."""


class MultiprocExecutorExitingWithParent(_ExitsWithParent, MultiprocExecutor):
    """vLLM's MultiprocExecutor (a worker process per rank) in an engine that exits with the generator."""


_EXITING = {UniProcExecutor: UniProcExecutorExitingWithParent, MultiprocExecutor: MultiprocExecutorExitingWithParent}


def executor_exiting_with_parent(executor_class: type) -> type:
    """vLLM's `executor_class` with the watch above (module-level classes: a spawned engine
    process unpickles the class by name)."""
    try:
        return _EXITING[executor_class]
    except KeyError:
        raise ValueError(f"no variant of vLLM's {executor_class.__name__} that exits with the generator "
                         "(distributed_executor_backend uni or mp)") from None
