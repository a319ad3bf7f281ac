"""Teacher scoring (coordinator/loop/teacher.py): the sequences spread over the live teachers by
capacity, a failed teacher's share re-sent to the others (it is reported), a request every
teacher would refuse raised at once, and no live teacher a clear error."""

from __future__ import annotations

import pytest
import structlog

from coordinator.loop.teacher import TeacherError, score_with_teachers
from coordinator.membership.services import GeneratorHandle
from tandem.generation.types import ScoredSequence, SequenceScores
from tandem.rpc import RpcFailure, Status

SEQUENCES = [ScoredSequence((1, 10 + i, 20 + i), 1) for i in range(6)]


class FakeTeacher:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.calls = fail, []

    def score(self, sequences, top_k=0, request_id="", timeout_s=600.0):
        self.calls.append([s.token_ids[1] for s in sequences])
        if self.fail is not None:
            raise self.fail
        return [SequenceScores(tuple(-float(t) for t in s.token_ids[s.prompt_length:])) for s in sequences]


def _handles(*teachers, capacity=4):
    return [GeneratorHandle(f"teacher-{i}", t, capacity) for i, t in enumerate(teachers)]


def test_sequences_are_spread_and_come_back_in_order():
    a, b = FakeTeacher(), FakeTeacher()
    scores = score_with_teachers(SEQUENCES, lambda: _handles(a, b), lambda h, e: None, structlog.get_logger())
    assert [s.logprobs for s in scores] == [(-(10.0 + i), -(20.0 + i)) for i in range(6)]
    assert a.calls == [[10, 11, 12]] and b.calls == [[13, 14, 15]]


def test_a_failed_teachers_share_goes_to_the_others():
    dead, alive = FakeTeacher(RpcFailure(Status.UNAVAILABLE, "connection reset")), FakeTeacher()
    live = _handles(dead, alive)
    failed = []

    def on_failure(handle, exc):
        failed.append(handle.member_id)
        live.remove(handle)

    scores = score_with_teachers(SEQUENCES, lambda: list(live), on_failure, structlog.get_logger())
    assert [s.logprobs[0] for s in scores] == [-(10.0 + i) for i in range(6)]
    assert failed == ["teacher-0"] and alive.calls == [[13, 14, 15], [10, 11, 12]]


def test_a_request_every_teacher_refuses_is_raised():
    refusing = FakeTeacher(RpcFailure(Status.INVALID_ARGUMENT, "sequence 0 has 70 tokens"))
    with pytest.raises(RpcFailure, match="70 tokens"):
        score_with_teachers(SEQUENCES, lambda: _handles(refusing), lambda h, e: None, structlog.get_logger())


def test_no_live_teacher_is_a_clear_error():
    with pytest.raises(TeacherError, match="no live distillation teacher"):
        score_with_teachers(SEQUENCES, list, lambda h, e: None, structlog.get_logger(), wait_for_teacher_s=0.05,
                            poll_s=0.01)
