"""Files that survive a crash: a small file replaced atomically and fsynced with its directory,
so a reader sees the old content or the new, never a torn one (the checkpoint's `latest`
pointer, the trainer's trainer_state.json)."""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(path: Path, text: str) -> None:
    """Write `text` to `path` through a fsynced temporary file renamed over it, then fsync the directory."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
