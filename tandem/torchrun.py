"""`python -m tandem.torchrun [torchrun arguments]`: torchrun (torch.distributed.run) as the
trainer's launcher, with two differences for a service: when its stderr is not a terminal,
its own output and its workers' are JSON lines like every service's (tandem/process_logs.py),
and a stop signal (SIGTERM from `docker stop` or the coordinator) that it forwards to the
workers, which drain and exit, ends it with code 0 instead of a traceback."""

from __future__ import annotations

import sys


def main() -> int:
    json_lines = not sys.stderr.isatty()
    if json_lines:
        from tandem.process_logs import json_everywhere

        json_everywhere("torchrun")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    if json_lines:  # torch gives its own loggers a plain-text handler when it is imported
        from tandem.process_logs import route_stdlib_logging

        route_stdlib_logging("torchrun")
    try:
        torchrun()
    except SignalException as exc:
        from tandem.logs import configure_logging

        configure_logging("torchrun").info("torchrun_stopped", signal=exc.sigval.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
