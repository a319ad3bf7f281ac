"""`python -m trainer_svc.torchrun [torchrun's arguments]`: torchrun, stopping cleanly on a signal.

torchrun (torch.distributed.run) answers SIGTERM or SIGINT by signalling its ranks, waiting for
them, and then raising `SignalException`, which ends it with a Python traceback although
nothing went wrong: the ranks were told to stop and did (rank 0 leaves the coordinator and
stops serving, then releases the others; trainer_svc/__main__.py). Here that exception ends the
launcher with one line and exit code 0; any other failure (a rank that crashed) is torchrun's
own report and exit code, unchanged.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name if isinstance(exc.sigval, int) else str(exc.sigval)
        print(f"trainer_svc.torchrun: stopped by {name}; every rank was told to stop", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
