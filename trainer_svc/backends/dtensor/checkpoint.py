"""Sharded checkpoints of the DTensor backend: DCP's plan and metadata for model + optimizer
over raw tensor bytes, one RNG file per rank.

Layout of a checkpoint directory (written by all ranks; the directory must be shared):
    dcp/                 torch.distributed.checkpoint: `.metadata` (DCP's, pickled) and one file
                         of raw tensor bytes per rank (`__<rank>_0.distcp`), plus `RAW` marking the
                         format (a checkpoint without it holds DCP's default torch.save items)
    rng/rank<R>.pt       torch RNG states of rank R (CPU and, on GPUs, CUDA)
    written/rank<R>      rank R's bytes are on disk (written after its fsync)
    trainer_state.json   {"global_step": ..., "world_size": ...} (rank 0, written last: the mark
                         of a complete checkpoint)
DCP reshards on load, so a checkpoint loads under another world size (RNG then stays as is).
`trained_only` (LoRA) leaves the frozen parameters out: the checkpoint holds the adapters and
their optimizer state, and loading restores those over the base weights loaded at start.

Why raw bytes (issue 28 item 6; benchmarks/checkpoint_real_size.py): DCP's default writes each
tensor as its own torch.save archive and reads it back into a fresh tensor, through ~260 KiB
reads, then copies it into the target; at Qwen2.5-0.5B's shape that load ran at a third of the
disk's speed. Here the tensors' bytes go to the file back to back and come back straight into
the tensors that hold them, both with O_DIRECT where the filesystem takes it (direct_io.py).

Background saves (`start_save(..., background=True)`): the plan, the metadata and the RNG are
written at once (they involve collectives), and the tensors' bytes by a thread that reads the
live tensors, then fsyncs. Nothing may change those tensors meanwhile: the backend calls
`PendingWrite.wait` before it changes parameters (the reference swap, a load) and before an
optimizer step (Adam's state). So the save costs no copy of the model; the step waits only if
the disk is slower than the work before its first change of the weights.

A save or load that DCP cannot finish (a full disk while it writes the metadata, a file it
cannot read) raises `CheckpointIOError`, an ordinary error that the lockstep reports and the
service answers: DCP's own CheckpointException is a BaseException, which passed through both and
killed every rank (benchmarks/chaos.py's full disk found it).
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from tandem.durable import replace_durably
from trainer_svc.backends.dtensor.direct_io import Chunk, bytes_of, read_ranges, write_chunks

STATE_FILE = "trainer_state.json"
RAW_MARK = "RAW"
_SMALL = 1 << 20
"""Tensors below this many bytes are copied when a background save starts (Adam's step
counters and the like: cheap, and then nothing small needs guarding)."""


def _options(trained_only: bool) -> StateDictOptions:
    return StateDictOptions(ignore_frozen_params=trained_only, strict=not trained_only)


@dataclass
class PendingWrite:
    """One rank's tensor bytes on their way to disk: a thread (background) or inline.
    `wait()` returns once they are written and fsynced, re-raising the write's error."""

    path: Path | None = None
    started: float = 0.0
    seconds: float = 0.0
    """The write's own duration (bytes and fsync), once done."""
    _thread: threading.Thread | None = None
    _error: BaseException | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def finished(cls) -> PendingWrite:
        done = cls()
        done._done.set()
        return done

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self) -> None:
        """Wait for the write to end, successful or not."""
        self._done.wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the write is done (False: `timeout` passed first); raises the write's error."""
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the checkpoint write to {self.path} failed: {error}") from error
        return True

    def run(self, work: Callable[[], None], *, background: bool) -> None:
        def target() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                self._error = exc
            finally:
                self.seconds = time.perf_counter() - self.started
                self._done.set()

        self.started = time.perf_counter()
        if background:
            self._thread = threading.Thread(target=target, name="checkpoint-write", daemon=True)
            self._thread.start()
        else:
            target()


class RawWriter(FileSystemWriter):
    """DCP storage writer of raw tensor bytes, one file per rank. `write_data` decides every item's
    place in the file (its length is known from its shape) and returns at once; the bytes are
    written by `write_file` (inline or from a thread: no collective in it)."""

    def __init__(self, path: str, direct: bool = True):
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=True)
        self._direct = direct
        self.file: Path | None = None
        self.chunks: list[Chunk] = []

    def write_data(self, plan, planner) -> Future[list[WriteResult]]:
        name = f"{plan.storage_data.prefix}0.distcp"
        self.file = Path(self.path) / name
        # the model's items first: the parameters are the first thing a step changes (the reference swap)
        items = sorted(plan.items, key=lambda item: not item.index.fqn.startswith("model."))
        results, offset = [], 0
        placed: dict[tuple[int, int, torch.dtype], int] = {}  # tied weights (an embedding and its LM head): once
        for item in items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                payload: torch.Tensor | bytes = data.getvalue()
                length = len(payload)
            else:
                tensor = data.detach()
                if not tensor.is_cpu:
                    raise ValueError(f"checkpoint tensor {item.index.fqn} is on {tensor.device}: raw writes take CPU "
                                     "tensors")
                length = tensor.numel() * tensor.element_size()
                key = (tensor.data_ptr(), length, tensor.dtype)
                if tensor.is_contiguous() and length >= _SMALL and key in placed:
                    results.append(WriteResult(index=item.index, size_in_bytes=length, storage_data=_StorageInfo(
                        relative_path=name, offset=placed[key], length=length)))
                    continue
                if not tensor.is_contiguous() or length < _SMALL:
                    tensor = tensor.contiguous().clone()
                else:
                    placed[key] = offset
                payload = tensor
            self.chunks.append(Chunk(offset, payload))
            results.append(WriteResult(index=item.index, size_in_bytes=length,
                                       storage_data=_StorageInfo(relative_path=name, offset=offset, length=length)))
            offset += length
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def write_file(self) -> str:
        """The bytes of every item, in order, then fsync; returns how ("direct" or "buffered")."""
        assert self.file is not None, "write_data plans the file first"
        try:
            return write_chunks(self.file, self.chunks, direct=self._direct)
        finally:
            self.chunks = []  # the references to the live tensors go with the write


class RawReader(FileSystemReader):
    """Reads what RawWriter wrote: each tensor's bytes straight into its target when the target is
    the whole saved chunk (the same sharding), else through a temporary (resharding); with
    O_DIRECT unless `direct` is False (`read_ranges`)."""

    def __init__(self, path: str, direct: bool = True):
        super().__init__(path)
        self._direct = direct

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._tensors = {fqn: md for fqn, md in metadata.state_dict_metadata.items()
                         if isinstance(md, TensorStorageMetadata)}

    def read_data(self, plan, planner) -> Future[None]:
        per_file: dict[str, list] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for relative_path, reqs in per_file.items():
            reqs.sort(key=lambda r: self.storage_data[r.storage_index].offset)
            read_ranges(Path(self.path) / relative_path, self._places(reqs, planner), direct=self._direct)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _places(self, reqs, planner) -> Iterator[tuple[int, memoryview]]:
        """Where each request's bytes go, in the file's order: (offset, memory to fill); each
        request is committed once its memory is filled (read_ranges asks for the next place only
        then), so a resharding temporary lives for one request."""
        done: set[tuple[int, int]] = set()  # (target, offset): a tied weight is read once
        for req in reqs:
            info: _StorageInfo = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                payload = bytearray(info.length)
                yield info.offset, memoryview(payload)
                planner.load_bytes(req, io.BytesIO(bytes(payload)))
                continue
            target = planner.resolve_tensor(req).detach()
            chunk = self._chunk_size(req)
            whole = (list(req.storage_offsets) == [0] * len(chunk) and list(req.lengths) == list(chunk))
            if whole and target.is_contiguous() and target.is_cpu and \
                    target.numel() * target.element_size() == info.length:
                if (target.data_ptr(), info.offset) not in done:
                    yield info.offset, bytes_of(target)
                    done.add((target.data_ptr(), info.offset))
            else:
                payload = bytearray(info.length)
                yield info.offset, memoryview(payload)
                dtype = self._tensors[req.storage_index.fqn].properties.dtype
                saved = torch.frombuffer(payload, dtype=dtype).reshape(chunk)
                for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths)):
                    saved = saved.narrow(dim, start, length)
                target.copy_(saved)
            planner.commit_tensor(req, target)

    def _chunk_size(self, req) -> torch.Size:
        md = self._tensors[req.storage_index.fqn]
        offsets = tuple(req.storage_index.offset) if req.storage_index.offset is not None else None
        for chunk in md.chunks:
            if offsets is None or tuple(chunk.offsets) == offsets:
                return chunk.sizes
        raise ValueError(f"checkpoint item {req.storage_index} has no chunk at offsets {offsets}")


def _alone() -> bool:
    """One rank: DCP's planning without its collectives (they pickle every plan: ~1.4 s at 0.5B)."""
    return dist.get_world_size() == 1


class CheckpointIOError(RuntimeError):
    """A DCP save or load failed on some rank (every rank raises it, with each failed rank's error)."""


@contextmanager
def _ordinary_errors(what: str, path: Path) -> Iterator[None]:
    """DCP's CheckpointException (a BaseException) as a CheckpointIOError naming each failed
    rank's error (e.g. `rank 0: OSError: [Errno 28] No space left on device`)."""
    try:
        yield
    except CheckpointException as exc:
        failures = "; ".join(f"rank {rank}: {type(error).__name__}: {error}"
                             for rank, (error, _trace) in sorted(exc.failures.items()))
        raise CheckpointIOError(f"the checkpoint {what} {path} failed: {failures}") from None


@contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's notes that one rank saves alone, and that a save replaces a directory's
    earlier one (a directory is reused after a failed write)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
        yield


def start_save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int,
               trained_only: bool = False, background: bool = False, direct: bool = True) -> PendingWrite:
    """Collective: plan the save and write DCP's metadata and this rank's RNG; the tensors' bytes
    go to disk inline or, with `background`, from a thread (see the module docstring), with
    O_DIRECT unless `direct` is False (direct_io.py). The checkpoint is complete once every rank's
    write is done and `finish_save` ran on rank 0."""
    (path / "rng").mkdir(parents=True, exist_ok=True)
    (path / "written").mkdir(exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=_options(trained_only))
    writer = RawWriter(str(path / "dcp"), direct=direct)
    with _quiet(), _ordinary_errors("save into", path):
        dcp.save({"model": model_state, "optim": optim_state}, storage_writer=writer, no_dist=_alone())
    if rank == 0:
        (path / "dcp" / RAW_MARK).write_text("raw tensor bytes (trainer_svc/backends/dtensor/checkpoint.py)\n")
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, path / "rng" / f"rank{rank}.pt")
    marker = path / "written" / f"rank{rank}"

    def write() -> None:
        writer.write_file()
        with open(marker, "w") as f:
            f.write("written\n")
            os.fsync(f.fileno())

    pending = PendingWrite(path)
    pending.run(write, background=background)
    return pending


def finish_save(path: Path, *, world_size: int, global_step: int, timeout_s: float) -> None:
    """Rank 0, once its own write is done: wait (up to timeout_s) for every rank's `written`
    marker, then write trainer_state.json, the mark of a complete checkpoint, and fsync it."""
    deadline = time.monotonic() + timeout_s
    missing = [r for r in range(world_size) if not (path / "written" / f"rank{r}").is_file()]
    while missing:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the checkpoint at {path}: ranks {missing} did not finish writing in {timeout_s:.0f}s")
        time.sleep(0.05)
        missing = [r for r in missing if not (path / "written" / f"rank{r}").is_file()]
    replace_durably(path / STATE_FILE, json.dumps({"global_step": global_step, "world_size": world_size}))


def is_checkpoint(path: Path) -> bool:
    return (path / STATE_FILE).is_file() and (path / "dcp" / ".metadata").is_file()


def _allocate_adam_state(optimizer: torch.optim.Optimizer) -> bool:
    """Give a fresh Adam/AdamW the state entries a load overwrites, uninitialised, so that DCP's
    get_state_dict does not run a zero-gradient step to make them (which allocates a gradient
    and zeroes both moments: seconds at 0.5B). False where that does not apply."""
    if optimizer.state or type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return False
    for group in optimizer.param_groups:
        if group.get("amsgrad") or group.get("capturable") or group.get("differentiable"):
            return False
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                  "exp_avg": torch.empty_like(p, memory_format=torch.preserve_format),
                                  "exp_avg_sq": torch.empty_like(p, memory_format=torch.preserve_format)}
    return True


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int,
                    trained_only: bool = False, direct: bool = True) -> int:
    """Restore model, optimizer and this rank's RNG; returns the saved global step. `direct`
    False reads through the page cache (checkpointing.direct_io)."""
    options = _options(trained_only)
    _allocate_adam_state(optimizer)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optim": optim_state}
    raw = (path / "dcp" / RAW_MARK).is_file()
    reader = RawReader(str(path / "dcp"), direct=direct) if raw else FileSystemReader(str(path / "dcp"))
    with _quiet(), _ordinary_errors("load from", path):
        dcp.load(state, storage_reader=reader, no_dist=_alone())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    rng_file = path / "rng" / f"rank{rank}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return int(json.loads((path / STATE_FILE).read_text())["global_step"])
