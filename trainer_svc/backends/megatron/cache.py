"""The conversion cache: an HF checkpoint converted once into Megatron's distributed
checkpoint format (`megatron.core.dist_checkpointing`, torch_dist backend), reused by later
starts at any TP/PP layout of the same padded vocabulary.

Directory, in priority order: `$TANDEM_MEGATRON_CHECKPOINT_DIR`; else `$HF_HOME/tandem`; else
`~/.cache/huggingface/tandem`. Each entry is `<dir>/<family>-<key>/`, where the key hashes the
source (absolute path, config.json bytes, weight files' names, sizes and mtimes), the padded
vocabulary and the format version. An entry is written under a temporary name and renamed
into place only after every rank finished writing and the marker file is in it, so a
conversion interrupted half-way is never read (its temporary directory is ignored).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path

import torch.distributed as dist

FORMAT_VERSION = 1
MARKER = "tandem_conversion.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    """The cache directory by the three-level priority (see module doc)."""
    env = os.environ if environ is None else environ
    if env.get("TANDEM_MEGATRON_CHECKPOINT_DIR"):
        return Path(env["TANDEM_MEGATRON_CHECKPOINT_DIR"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "tandem"
    return Path(env.get("HOME", str(Path.home()))).expanduser() / ".cache" / "huggingface" / "tandem"


def entry_name(model_dir: str | Path, family: str, padded_vocab: int) -> str:
    """`<family>-<hash>`: changes when the source checkpoint or the padded vocabulary does."""
    root = Path(model_dir).resolve()
    digest = hashlib.sha256(json.dumps({"path": str(root), "format": FORMAT_VERSION, "vocab": padded_vocab}).encode())
    digest.update((root / "config.json").read_bytes())
    for file in sorted(root.iterdir()):
        if file.name.endswith(WEIGHT_SUFFIXES):
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{family}-{digest.hexdigest()[:16]}"


def is_complete(entry: Path) -> bool:
    return (entry / MARKER).is_file()


def check_shared(root: Path, rank: int, group: dist.ProcessGroup) -> None:
    """Collective: every rank must see a probe file that rank 0 wrote into `root`."""
    token = [secrets.token_hex(8) if rank == 0 else ""]
    failed = ""
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / f".probe-{token[0]}").write_text(token[0])
        except OSError as exc:
            failed = f"rank 0 cannot write it ({exc})"
    dist.broadcast_object_list(token, src=0, group=group)
    probe = root / f".probe-{token[0]}"
    if not failed and not (probe.is_file() and probe.read_text() == token[0]):
        failed = f"rank {rank} does not see rank 0's files there"
    failures: list[str] = [""] * dist.get_world_size(group)
    dist.all_gather_object(failures, failed, group=group)
    dist.barrier(group=group)
    if rank == 0:
        probe.unlink(missing_ok=True)
    bad = [f for f in failures if f]
    if bad:
        raise ValueError(f"the Megatron conversion cache {root} is not reachable from every trainer rank: "
                         f"{'; '.join(bad)}. Set TANDEM_MEGATRON_CHECKPOINT_DIR (or HF_HOME) to a directory "
                         "that every rank shares")


def temporary_entry(entry: Path, rank: int, group: dist.ProcessGroup) -> Path:
    """Collective: a fresh temporary directory beside `entry`, the same on every rank."""
    name = [f".{entry.name}.tmp-{secrets.token_hex(4)}" if rank == 0 else ""]
    dist.broadcast_object_list(name, src=0, group=group)
    tmp = entry.parent / name[0]
    if rank == 0:
        tmp.mkdir(parents=True)
    dist.barrier(group=group)
    return tmp


def publish_entry(tmp: Path, entry: Path, info: dict, rank: int, group: dist.ProcessGroup) -> None:
    """Collective, after every rank wrote into `tmp`: marker, then atomic rename to `entry`."""
    dist.barrier(group=group)
    if rank == 0:
        (tmp / MARKER).write_text(json.dumps(info, indent=2))
        if entry.exists() and not is_complete(entry):  # left by an interrupted publish: never read, replace it
            shutil.rmtree(entry)
        try:
            tmp.rename(entry)
        except OSError:  # another run published the same entry first: keep theirs
            if not is_complete(entry):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier(group=group)
