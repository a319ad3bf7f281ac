"""Atomic build-once directory cache shared by the embedded model and dataset.

An entry is built in a temporary directory beside its final location, marked
complete, then moved into place with a single ``os.rename``. Readers only ever
see complete entries; concurrent builders race on the rename and the loser
discards its copy. Leftover temporary directories (from crashed builds) are never
mistaken for entries, and an entry without the completion marker is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    """Where built models and datasets are kept: $TANDEM_HOME, else ~/.cache/tandem."""
    return Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache" / "tandem"))

_TMP_INFIX = ".tmp-"
_STALE_TMP_AGE_S = 3600.0


def short_hash(payload: dict[str, Any], length: int = 10) -> str:
    """Stable short hex digest of a JSON-serialisable mapping."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def is_complete(entry: Path) -> bool:
    """True when ``entry`` is a finished cache entry."""
    return (entry / COMPLETE_MARKER).is_file()


def _remove_stale_temps(parent: Path, name: str) -> None:
    """Delete temp dirs of ``name`` left by builds that died long ago."""
    cutoff = time.time() - _STALE_TMP_AGE_S
    for leftover in parent.glob(f".{name}{_TMP_INFIX}*"):
        try:
            if leftover.stat().st_mtime < cutoff:
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            continue


def _quarantine(entry: Path) -> None:
    """Move an incomplete entry out of the way so it can be rebuilt."""
    trash = entry.with_name(f".{entry.name}{_TMP_INFIX}broken-{os.getpid()}-{time.time_ns()}")
    try:
        os.rename(entry, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def ensure_entry(entry: Path, build: Callable[[Path], None]) -> Path:
    """Return ``entry``, building it with ``build(tmp_dir)`` first if it is absent.

    ``build`` must fill the (existing, empty) directory it is given.
    """
    if is_complete(entry):
        return entry
    parent = entry.parent
    parent.mkdir(parents=True, exist_ok=True)
    if entry.exists():
        _quarantine(entry)
    _remove_stale_temps(parent, entry.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}{_TMP_INFIX}", dir=parent))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        os.rename(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_complete(entry):  # another process won the rename race
            return entry
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry
