"""A distillation teacher's scores of the student's samples: the sequences are spread over the
live teacher services (generator services serving the teacher, `ServiceKind.TEACHER`) by their
capacity, one ScoreTokens call per teacher, and the share of a teacher whose call fails is sent
to the teachers still alive, as a rollout re-sends a dead generator's prompts
(coordinator/loop/rollout.py). A teacher's weights never change, so which one scores a sequence
makes no difference beyond float rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from coordinator.loop.rollout import split_by_capacity
from coordinator.membership.services import GeneratorHandle
from tandem.generation.types import ScoredSequence, SequenceScores
from tandem.rpc import RpcFailure


class TeacherError(RuntimeError):
    """No live teacher could score the step's samples."""


def score_with_teachers(sequences: Sequence[ScoredSequence], teachers: Callable[[], list[GeneratorHandle]],
                        on_failure: Callable[[GeneratorHandle, Exception], None], log, *, top_k: int = 0,
                        max_rounds: int = 5, timeout_s: float = 600.0, wait_for_teacher_s: float = 120.0,
                        poll_s: float = 0.5) -> list[SequenceScores]:
    """One SequenceScores per sequence, in order. `teachers()` returns the live teachers (asked again
    each round; with none live it is polled up to wait_for_teacher_s, while a dead one is relaunched);
    `on_failure` tells membership about a teacher whose call failed and closes its client. A request
    every teacher would refuse (INVALID_ARGUMENT: too long, ids outside the vocabulary) is raised."""
    results: dict[int, SequenceScores] = {}
    pending = list(range(len(sequences)))
    for _ in range(max_rounds):
        live = _live_teachers(teachers, wait_for_teacher_s, poll_s)
        shares = [(handle, [pending[i] for i in share])
                  for handle, share in zip(live, split_by_capacity(len(pending), [t.capacity for t in live])) if share]
        failed: list[int] = []
        with ThreadPoolExecutor(len(shares), thread_name_prefix="teacher") as pool:
            futures = [(handle, share, pool.submit(handle.client.score, [sequences[i] for i in share], top_k,
                                                   handle.member_id, timeout_s)) for handle, share in shares]
            for handle, share, future in futures:
                exc = future.exception()
                if exc is None:
                    results.update(zip(share, future.result()))
                    continue
                if not isinstance(exc, RpcFailure | ConnectionError) or (
                        isinstance(exc, RpcFailure) and exc.status.rejects_request):
                    raise exc
                log.warning("teacher_failed", member_id=handle.member_id, sequences=len(share),
                            error=exc.status.name if isinstance(exc, RpcFailure) else repr(exc))
                on_failure(handle, exc)
                failed.extend(share)
        pending = sorted(failed)
        if not pending:
            return [results[i] for i in range(len(sequences))]
        log.info("teacher_resend", sequences=len(pending))
    raise TeacherError(f"{len(pending)} sequences still unscored by a teacher after {max_rounds} rounds")


def _live_teachers(teachers: Callable[[], list[GeneratorHandle]], wait_s: float, poll_s: float) -> list[GeneratorHandle]:
    deadline = time.monotonic() + wait_s
    while not (live := teachers()):
        if time.monotonic() >= deadline:
            raise TeacherError(f"no live distillation teacher for {wait_s:.0f}s (distillation.teacher.num_generators "
                               "teacher services are launched, or waited for with cluster.launch external)")
        time.sleep(poll_s)
    return live
