"""The line of a dead service's log that names why it died, for the message the run shows
(the whole log stays in <run>/logs/<service>.log).

A service that fails at start leaves a Python traceback (sometimes several: a rank's, then
torchrun's own; vLLM's engine process, then the front end's), with prefixes that say which
process wrote it (`[rank0]: `, `(EngineCore pid=12) `). The cause is the last exception line
that is not a wrapper reporting that something else failed (torchrun's ChildFailedError,
vLLM's "Engine core initialization failed. See root cause above"); structured log lines with
an `exception` or `error` field count too, and output that the JSON logging wrapped
(`"event": "output"`) is read as the text it wraps. Failing all that (an exit with a message and no
traceback), the last line of the log.
"""

from __future__ import annotations

import json
import re

_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s?|\([\w.-]+ pid=\d+\)\s*)")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault|Refused)"
                        r"(?::\s*(?P<message>.*))?$")
_WRAPPERS = ("ChildFailedError", "SignalException", "See root cause above", "Engine core initialization failed",
             "EngineDeadError")
_NOISE = re.compile(r"^(?:Traceback \(most recent call last\):|File \"|\s|\^|~|During handling|The above exception|"
                    r"=+$|-+$|rc \d+$)")
MAX_CHARS = 400


def cause_line(text: str) -> str | None:
    """The line of `text` (a service's log) that names the cause of its exit; None if empty."""
    lines = [_PREFIX.sub("", _unwrapped(line.rstrip())) for line in text.splitlines()]
    causes = [c for c in (_cause_of(line) for line in lines) if c]
    useful = [c for c in causes if not any(w in c for w in _WRAPPERS)]
    if useful:
        return useful[-1][:MAX_CHARS]
    plain = [line for line in lines if line.strip() and not _NOISE.match(line) and not line.startswith("{")]
    if plain:
        return plain[-1].strip()[:MAX_CHARS]
    return causes[-1][:MAX_CHARS] if causes else None


def _unwrapped(line: str) -> str:
    """A line of third-party output that a service's JSON logging wrapped
    (`{"event": "output", "text": ...}`, tandem/process_logs.py) as it was written."""
    if line.startswith("{") and '"output"' in line:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return line
        if isinstance(event, dict) and event.get("event") == "output" and isinstance(event.get("text"), str):
            return event["text"].rstrip()
    return line


def _cause_of(line: str) -> str | None:
    """An exception line (`ValueError: ...`), or the exception/error of a structured log line."""
    if line.startswith("{"):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return None
        if not isinstance(event, dict) or event.get("level") not in ("error", "critical", "exception"):
            return None
        for key in ("exception", "error"):
            if isinstance(event.get(key), str) and event[key].strip():
                last = event[key].strip().splitlines()[-1]
                return _cause_of(last) or last
        return None
    match = _EXCEPTION.match(line.strip())
    if match is None or not (match.group("message") or "").strip():
        return None  # a bare exception name (torchrun's "ChildFailedError: ") says nothing
    return line.strip()
