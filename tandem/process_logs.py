"""Every line a service process writes is a JSON object, not only its own structlog events.

Three layers, from the cleanest to the catch-all:
1. stdlib logging (vLLM, torch, transformers, `warnings`) goes through `JsonFormatter`, whose
   lines have structlog's shape (service, event, level, timestamp) plus the logger's name.
2. vLLM configures logging itself in each of its processes (the API process, the engine core,
   its workers); `vllm_logging_env` hands it a dictConfig file that uses the same formatter,
   at WARNING unless VLLM_LOGGING_LEVEL says otherwise (its INFO lines are start-up chatter).
3. `capture_output` sends the process's file descriptors 1 and 2, inherited by its children,
   through a pipe that a small forwarder process reads (it outlives a crash of the service, so
   a fatal error's last lines are kept): a line that is JSON passes unchanged; anything else
   (C++ warnings from torch/gloo, tqdm bars, a traceback, print) becomes
   {"event": "output", "text": ...} with a level guessed from the line.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

KNOWN_NOISE = (
    # vLLM on CPU, said at every start or weight swap, about things that are as intended here:
    "Triton is installed, but doesn't include CPU backend",  # no Triton on CPU: PyTorch kernels are used
    "Triton is not installed. triton-cpu is expected",
    "Model Runner V2 requires Triton",
    "libtcmalloc is not found in LD_PRELOAD", "libiomp is not found in LD_PRELOAD",  # speed hints only
    "does not officially support disabling chunked prefill",  # the tiny models run fine without it
    "Enforce eager set, disabling torch.compile", "Inductor compilation was disabled",  # enforce_eager: true
    "Reset SSM cache type to float32",  # no Mamba layers here
    "RotaryEmbedding: Failed to load weights",  # rotary embeddings have no weights to load
    "Passing raw prompts to InputProcessor is deprecated",
    "NUMA binding: Using MEMBIND policy",  # a C++ notice from the vLLM CPU worker
    "`torch.distributed.reduce_op` is deprecated",
    "[shutdown] Process manager: force killing remaining process",  # a CPU engine's exit grace is short on purpose
)
"""Third-party warnings that are expected on this stack: dropped at the default levels (set
VLLM_LOGGING_LEVEL=INFO or lower to see everything)."""

_GLOG = re.compile(r"^\[?([IWEF])\d{4} ")
_GLOG_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}
_ERROR = re.compile(r"^(Traceback \(most recent call last\)|\w+(\.\w+)*(Error|Exception)\b)")


def _timestamp(seconds: float | None = None) -> str:
    when = datetime.now(UTC) if seconds is None else datetime.fromtimestamp(seconds, UTC)
    return when.isoformat().replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """A stdlib log record as one JSON line shaped like the services' structlog events."""

    def __init__(self, service: str = "", **_: object):
        super().__init__()
        self.service = service or os.environ.get("TANDEM_SERVICE", "")

    def format(self, record: logging.LogRecord) -> str:
        line = {"service": self.service, "logger": record.name, "event": record.getMessage().rstrip(),
                "level": record.levelname.lower(), "timestamp": _timestamp(record.created), "pid": record.process}
        process = getattr(record, "vllm_process_name", None)
        if process:
            line["process"] = process
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def _verbose(level: str) -> bool:
    """A level below WARNING: the user asked to see everything, known noise included."""
    number = logging.getLevelName(level.upper())
    return isinstance(number, int) and number < logging.WARNING


class DropKnownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in KNOWN_NOISE)


def route_stdlib_logging(service: str, level: str = "WARNING") -> None:
    """Root logger (and `warnings`) to stderr through JsonFormatter; loggers that print with
    their own handlers (torch's) are pointed at it too."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    handler.addFilter(DropKnownNoise())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
    for name in ("torch", "vllm", "transformers"):
        logger = logging.getLogger(name)
        if logger.handlers:
            logger.handlers[:] = [handler]


def vllm_logging_env(config_path: Path, service: str, current: dict[str, str]) -> dict[str, str]:
    """Write vLLM's logging config (JSON lines on stderr) to config_path; the environment that
    makes every vLLM process use it."""
    level = current.get("VLLM_LOGGING_LEVEL", "WARNING").upper()
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"json": {"()": "tandem.process_logs.JsonFormatter", "service": service}},
        "filters": {"noise": {"()": "tandem.process_logs.DropKnownNoise"}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr",
                              "filters": [] if _verbose(level) else ["noise"]}},
        "loggers": {"vllm": {"handlers": ["json"], "level": level, "propagate": False}},
        "root": {"handlers": ["json"], "level": "WARNING"},
    }
    config_path.write_text(json.dumps(config))
    return {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_CONFIG_PATH": str(config_path), "VLLM_LOGGING_LEVEL": level}


def wrap_line(text: str, service: str, previous_level: str = "info") -> tuple[str, str]:
    """(`text` if it is a JSON object, else a JSON event holding it; the level it was given).
    An indented line goes on at the previous line's level (a traceback's frames)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            if isinstance(json.loads(stripped), dict):
                return stripped, "info"
        except ValueError:
            pass
    glog = _GLOG.match(stripped)
    level = (_GLOG_LEVELS[glog.group(1)] if glog else "error" if _ERROR.match(stripped)
             else previous_level if text[:1].isspace() else "info")
    return json.dumps({"service": service, "event": "output", "text": text.rstrip(), "level": level,
                       "timestamp": _timestamp()}), level


class _Capture:
    """fds 1 and 2 go into a pipe read by a forwarder *process* (`python -m tandem.process_logs`):
    a thread would die with a process that crashes, and with it that process's last words."""

    def __init__(self, service: str):
        self.original = os.dup(2)
        read_fd, write_fd = os.pipe()
        self.forwarder = subprocess.Popen([sys.executable, "-m", "tandem.process_logs", service], stdin=read_fd,
                                          stdout=self.original, stderr=self.original, close_fds=True)
        os.close(read_fd)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)

    def release(self) -> None:
        """At exit: give fds 1 and 2 back to the real stderr so the forwarder reads to the end of
        what this process wrote (children that outlive it keep the pipe open: bounded wait)."""
        _flush_std()
        os.dup2(self.original, 1)
        os.dup2(self.original, 2)
        _stop_resource_tracker()
        try:
            self.forwarder.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass  # it ends by itself once the last child holding the pipe has exited


def _stop_resource_tracker() -> None:
    """multiprocessing's resource tracker (started by vLLM's semaphores) holds the pipe as its
    stderr until this process is gone, so the forwarder would wait for our exit and `release`
    for the forwarder: 2 s lost at every exit. Stopped now, it reports any leak and ends (a later
    user starts a new one). `_stop` is CPython's own; absent elsewhere, nothing is done."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    if getattr(tracker, "_pid", None) is not None and hasattr(tracker, "_stop"):
        tracker._stop()


def forward(service: str, source, sink) -> None:
    """Copy `source` to `sink` (binary streams) line by line, each line a JSON object."""
    keep_noise = _verbose(os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"))
    level = "info"
    for raw in source:
        for line in raw.replace(b"\r", b"\n").split(b"\n"):  # tqdm redraws its bar with carriage returns
            if line.strip() and (keep_noise or not any(n.encode() in line for n in KNOWN_NOISE)):
                text, level = wrap_line(line.decode(errors="replace"), service, level)
                sink.write(text.encode() + b"\n")
        sink.flush()


_active: _Capture | None = None


def capture_output(service: str) -> None:
    """Route fds 1 and 2 of this process (and of the children it starts from now on) through
    a forwarder process that writes JSON lines to the real stderr; idempotent."""
    global _active
    if _active is None:
        _active = _Capture(service)
        atexit.register(_active.release)


def exit_now(code: int) -> NoReturn:
    """End this process with `code` without the interpreter's teardown, once its work and its own
    clean-up are done. A generator's teardown garbage-collects vLLM's and torch's heap (~2 s on a
    2-core machine, the stop of every run waiting on it) and lets native extensions print to the
    raw stderr. Logs are flushed and the capture released first, so no line is lost."""
    logging.shutdown()
    if _active is not None:
        _active.release()
    else:
        _flush_std()
    os._exit(code)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def json_everywhere(service: str) -> None:
    """All of the above for a service process whose stderr is not a terminal."""
    os.environ.setdefault("TANDEM_SERVICE", service)
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars are for terminals
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    capture_output(service)
    route_stdlib_logging(service)


if __name__ == "__main__":  # the forwarder: stops at the end of its input, not on the signals sent to its group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    forward(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)
