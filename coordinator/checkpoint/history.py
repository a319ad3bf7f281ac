"""The metric history a loop checkpoint keeps: a mark of the rows of the run's metrics.jsonl
that are its own (where the run's rows begin, how many, a digest of them), not the rows.

A checkpoint that held the rows grew with the run, and so did its save: over a 6500-step run
with a checkpoint every step, saves went from 0.05 s to 0.2-0.4 s and steps from 0.28 to 0.55 s
(benchmarks/results/2026-11-28-chaos-async-seed41-6500steps.md). metrics.jsonl has the rows
anyway: the run only appends to it (coordinator/metrics/log.py:MetricsLog), and a resume cuts it
back to a checkpoint's rows, never shorter, so the rows a checkpoint marked are still there
when a resume reads them back (`checkpoint_lines`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


class HistoryMismatch(ValueError):
    """metrics.jsonl does not hold the rows a checkpoint marks: it was moved, cut or edited, or
    the checkpoint is another run's."""


@dataclass(frozen=True)
class HistoryMark:
    """Which rows of the run's metrics.jsonl a checkpoint's history is."""

    offset: int
    """The byte of metrics.jsonl at which the run's rows begin (the rows before it are those of
    an earlier run under the same name, which this one appended to)."""
    num_rows: int
    """The checkpoint's rows from `offset` on: those logged before it, then its own step's row
    (which the loop logs just after the checkpoint)."""
    sha256: str
    """Of the rows logged before the checkpoint (the first num_rows - 1 lines), as written."""
    own_row: dict
    """The checkpoint step's row as the checkpoint saw it: it stands in for metrics.jsonl's
    when the coordinator died before writing that row."""

    @classmethod
    def after(cls, written: tuple[int, int, str], own_row: dict) -> HistoryMark:
        """The mark of the rows written so far (MetricsLog.written: their offset, number and
        sha256), then `own_row`. Constant in size and in time, however long the history."""
        offset, num_written, sha256 = written
        return cls(offset=offset, num_rows=num_written + 1, sha256=sha256, own_row=own_row)

    @classmethod
    def from_json(cls, data: dict) -> HistoryMark:
        return cls(**data)


def checkpoint_lines(path: Path, mark: HistoryMark, checkpoint: Path | str = "the checkpoint") -> list[str]:
    """The lines of `path` (metrics.jsonl) that are the checkpoint's rows, as written, without
    their newlines. The lines after them (rows the interrupted run logged after the checkpoint,
    a row cut by its death) are not returned: the resumed run logs those steps again.

    The checkpoint's own row (the last) is metrics.jsonl's when it was written, else the one the
    checkpoint kept (the coordinator died between the checkpoint and that row). Any other
    difference is an error, not a fallback: HistoryMismatch when `path` is missing, holds fewer
    rows than the mark counts, or holds other rows than those the checkpoint saw. A resume
    rewrites metrics.jsonl to these lines, so a fallback (an empty or shorter history) would drop
    finished rows for good, or keep rows that are not the checkpoint's; the error comes before
    anything is changed, and says what to put back."""
    def mismatch(what: str) -> HistoryMismatch:
        return HistoryMismatch(f"cannot resume from {checkpoint}: {what}. Its metric history is the "
                               f"{mark.num_rows} rows of {path} from byte {mark.offset} on (the run's metrics.jsonl "
                               "as the checkpoint left it, or a longer one); put that file back, or start the run "
                               "afresh under another logger.run_name")

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise mismatch(f"{path} is missing") from None
    lines = data[mark.offset:].split(b"\n")[:-1]  # the last piece: empty, or a row cut by a crash
    before = mark.num_rows - 1  # the rows logged before the checkpoint
    if len(lines) < before:
        raise mismatch(f"{path} holds {len(lines)} of the {before} rows logged before it from byte {mark.offset} on "
                       f"(it is {len(data)} bytes long)")
    if hashlib.sha256(b"".join(line + b"\n" for line in lines[:before])).hexdigest() != mark.sha256:
        raise mismatch(f"the first {before} rows of {path} from byte {mark.offset} on are not those it saw "
                       "(edited, or another run's)")
    kept = [line.decode() for line in lines[:before]]
    if len(lines) == before:
        return [*kept, json.dumps(mark.own_row)]  # never written
    own = lines[before].decode()
    try:
        row = json.loads(own)
        logged = (row["phase"], row["step"])
    except (ValueError, TypeError, KeyError):
        raise mismatch(f"line {before + 1} of {path} from byte {mark.offset} on is not a metrics row") from None
    expected = (mark.own_row["phase"], mark.own_row["step"])
    if logged != expected:
        raise mismatch(f"its own row ({expected[0]} step {expected[1]}) is not line {before + 1} of {path} from "
                       f"byte {mark.offset} on ({logged[0]} step {logged[1]} is)")
    return [*kept, own]
