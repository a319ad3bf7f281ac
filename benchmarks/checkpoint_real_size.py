"""Checkpoint save and load of the DTensor trainer at a real model's size, against the disk.

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_real_size.py --reps 2

One DTensorBackend on one gloo rank loads a random-init checkpoint of Qwen2.5-0.5B's shape
(benchmarks/real_size_model.py) with Adam's state allocated (what a checkpoint after a train
step holds: fp32 parameters and both moments), then, interleaved A/B:
  old   DCP's default storage (a torch.save archive per tensor, read back through torch.load and
        copied into the target) and, on load into a fresh optimizer, DCP's zero-gradient
        optimizer step that makes Adam's state (the code before issue 28 item 6)
  new   trainer_svc/backends/dtensor/checkpoint.py: raw tensor bytes, written by a thread while
        the caller goes on (`save returns` is what a GRPO step waits; `durable` is the write's
        end, after fsync), read back with O_DIRECT straight into each target, Adam's state
        allocated without a step
  buffered  as new, but read through the page cache (the load before O_DIRECT reads)
Every load is cold: the checkpoint's pages are dropped from the page cache first (fadvise), and
the load goes into an optimizer without state (as in a freshly started trainer). Each save and
load also reports its peak RSS above the RSS before it (what it stages beside the model). The disk is
measured in the same run: write + fsync of as many bytes in 64 MiB writes, and a cold read of
them. Writes benchmarks/results/<date>-checkpoint-real-size.md (--no-write: print only).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import time
from pathlib import Path

import torch.distributed.checkpoint as dcp
from raw_io import disk_seconds, evict
from real_size_model import ensure_real_size_model
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer_svc.backends.dtensor import DTensorBackend, checkpoint
from trainer_svc.config import TrainerSettings
from trainer_svc.distributed import close_distributed, init_distributed


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in _files(root))


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class PeakGrowth:
    """The process's peak RSS over a block above its RSS before it (VmHWM, reset first), in GiB:
    the memory a save or a load stages beside the model."""

    def __enter__(self) -> PeakGrowth:
        Path("/proc/self/clear_refs").write_text("5")
        self.before = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.gib = (_status_bytes("VmHWM") - self.before) / 2**30


def old_save(backend: DTensorBackend, path: Path) -> None:
    model_state, optim_state = get_state_dict(backend._model, backend._optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path / "dcp"))


def old_load(backend: DTensorBackend, path: Path) -> None:
    model_state, optim_state = get_state_dict(backend._model, backend._optimizer)  # a zero-gradient step first
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(backend._model, backend._optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _fingerprint(backend: DTensorBackend) -> float:
    optim = [v for s in backend._optimizer.state.values() for v in s.values()]
    return float(sum(t.to_local().double().sum() if hasattr(t, "to_local") else t.double().sum()
                     for t in [*backend._params, *optim]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b", help="a size of benchmarks/real_size_model.py SHAPES")
    parser.add_argument("--reps", type=int, default=2, help="A/B pairs")
    parser.add_argument("--dir", default=None, help="where to write the checkpoints (default: beside the model)")
    parser.add_argument("--variants", default="old,new", help="comma-separated: old, new, buffered")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    model_dir = ensure_real_size_model(args.shape)
    root = Path(args.dir) if args.dir else model_dir.parent / "checkpoint-bench"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = init_distributed(600)
    backend = DTensorBackend(TrainerSettings(model_name=str(model_dir)), env)
    get_state_dict(backend._model, backend._optimizer)  # Adam's state, as after a first step
    backend._optimizer.zero_grad(set_to_none=True)
    expected = _fingerprint(backend)
    variants = args.variants.split(",")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    nbytes = 0
    disks = []
    for rep in range(args.reps):
        for name in variants:
            path = root / f"{name}-{rep}"
            figures: dict[str, float] = {}
            start = time.perf_counter()
            with PeakGrowth() as saving:
                if name == "old":
                    old_save(backend, path)
                    figures["save returns"] = figures["durable"] = time.perf_counter() - start
                else:
                    backend.save_checkpoint(path, background=True)
                    figures["save returns"] = time.perf_counter() - start
                    assert backend.checkpoint_written(path, timeout_s=600)
                    figures["durable"] = time.perf_counter() - start
            figures["save peak +GiB"] = saving.gib
            nbytes = _size(path / "dcp")
            evict(path)
            backend._optimizer.state.clear()  # as in a fresh trainer
            start = time.perf_counter()
            with PeakGrowth() as loading:
                if name == "old":
                    old_load(backend, path)
                elif name == "buffered":
                    checkpoint.load_checkpoint(path, backend._model, backend._optimizer, rank=0, direct=False)
                else:
                    backend.load_checkpoint(path)
            figures["load (cold)"] = time.perf_counter() - start
            figures["load peak +GiB"] = loading.gib
            got = _fingerprint(backend)
            assert abs(got - expected) <= 1e-6 * max(1.0, abs(expected)), (name, got, expected)
            shutil.rmtree(path)
            rows[name].append(figures)
            print(name, rep, {k: round(v, 2) for k, v in figures.items()}, flush=True)
        disks.append(disk_seconds(root, nbytes))
        print("disk", rep, [round(x, 2) for x in disks[-1]], flush=True)
    gib = nbytes / 2**30
    keys = ["save returns", "durable", "load (cold)", "save peak +GiB", "load peak +GiB"]
    command = (f"`PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_real_size.py --reps {args.reps}` (one process, "
               f"one gloo rank); {backend.num_parameters / 1e6:.1f}M parameters, fp32, with Adam's state; the last "
               f"checkpoint's tensors: {nbytes} bytes ({gib:.2f} GiB); load average "
               f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end.")
    lines = [f"# Checkpoint save and load at {args.shape}'s shape (DTensor trainer, one rank): {datetime.date.today()}",
             "", command, "",
             "| variant | " + " | ".join(f"{k}{'' if 'GiB' in k else ' s'} (each)" for k in keys) + " |", "| --- |" + " --- |" * len(keys)]
    for name, runs in rows.items():
        lines.append(f"| {name} | " + " | ".join(", ".join(f"{r[k]:.2f}" for r in runs) for k in keys) + " |")
    writes, reads = [d[0] for d in disks], [d[1] for d in disks]
    disk_line = (f"The disk, as many bytes in one file: write + fsync {', '.join(f'{w:.2f}' for w in writes)} s "
                 f"({gib / statistics.median(writes):.2f} GiB/s), cold read {', '.join(f'{r:.2f}' for r in reads)} s "
                 f"({gib / statistics.median(reads):.2f} GiB/s).")
    lines += ["", disk_line, "", "Medians:", ""]
    for name, runs in rows.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {statistics.median(r[k] for r in runs):.2f}" for k in keys))
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        out = Path(__file__).parent / "results" / f"{datetime.date.today()}-checkpoint-real-size.md"
        out.write_text(text)
        print(f"written: {out}")
    shutil.rmtree(root, ignore_errors=True)
    backend.close()
    close_distributed()


if __name__ == "__main__":
    main()
