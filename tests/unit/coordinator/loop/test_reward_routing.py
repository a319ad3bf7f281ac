"""RewardRouter with a refreshable view of the live services: a swapped service takes over,
a dead one is dropped and its call retried with backoff, the run pauses (with a clear
message) while no service serves the task and resumes when one is back; bad requests raise.
And the pre-run check that every dataset task has an env section."""

import pytest

from coordinator.config import ConfigError
from coordinator.loop.scoring import RewardRouter, check_tasks_configured
from reward_svc.types import ScoreItem, ScoreResult
from tandem.rpc import RpcFailure, Status


def _RpcError(status: Status) -> RpcFailure:
    return RpcFailure(status, "test")


class _Client:
    def __init__(self, reward, fail_with=None):
        self.reward, self.fail_with, self.calls = reward, fail_with, 0

    def score(self, items):
        self.calls += 1
        if self.fail_with is not None:
            raise _RpcError(self.fail_with)
        return [ScoreResult(self.reward, True) for _ in items]


class _Log:
    def __init__(self):
        self.events = []

    def warning(self, event, **fields):
        self.events.append((event, fields))


def _router(views, **kwargs):
    """refresh() walks through `views` (dicts task -> client), staying on the last."""
    state = {"i": -1}
    failed, sleeps, log = [], [], _Log()

    def refresh():
        state["i"] = min(state["i"] + 1, len(views) - 1)
        return views[state["i"]]

    router = RewardRouter(views[0], refresh=refresh, on_failure=lambda c, e: failed.append(c), log=log,
                          sleep=sleeps.append, **kwargs)
    return router, failed, sleeps, log


ITEMS = [ScoreItem("t", "p", "c", "a")] * 3


def test_each_call_takes_the_service_registered_now():
    old, new = _Client(0.0), _Client(1.0)
    router, failed, sleeps, _ = _router([{"t": old}, {"t": new}])
    assert [r.reward for r in router.score(ITEMS)] == [0.0] * 3
    assert [r.reward for r in router.score(ITEMS)] == [1.0] * 3  # swapped: no restart, no failure
    assert not failed and not sleeps


def test_dead_service_is_dropped_and_the_call_retried_on_its_replacement():
    dead, new = _Client(0.0, fail_with=Status.UNAVAILABLE), _Client(1.0)
    router, failed, sleeps, log = _router([{"t": dead}, {"t": dead}, {}, {"t": new}])
    assert [r.reward for r in router.score(ITEMS)] == [1.0] * 3
    assert failed == [dead, dead] and dead.calls == 2
    assert sleeps == [0.25, 0.5, 1.0]  # exponential backoff
    assert [e for e, _ in log.events] == ["reward_retry"] * 3


def test_run_pauses_with_a_clear_message_until_a_service_is_back():
    back = _Client(1.0)
    router, _, sleeps, log = _router([{}] * 8 + [{"t": back}], retry_deadline_s=0.0, pause_log_period_s=0.0,
                                     max_backoff_s=1.0)
    assert [r.reward for r in router.score(ITEMS)] == [1.0] * 3
    assert max(sleeps) == 1.0 and len(sleeps) == 8
    events = [e for e, _ in log.events]
    assert events[0] == "reward_paused" and events[-1] == "reward_resumed"
    message = log.events[0][1]["message"]
    assert "paused" in message and "'t'" in message and "python -m reward_svc" in message


def test_a_bad_request_is_not_retried():
    bad = _Client(0.0, fail_with=Status.INVALID_ARGUMENT)
    router, failed, sleeps, _ = _router([{"t": bad}])
    with pytest.raises(RpcFailure):
        router.score(ITEMS)
    assert bad.calls == 1 and not failed and not sleeps


def test_dataset_tasks_without_an_env_section_are_a_config_error():
    check_tasks_configured({"train.jsonl": {"a", "b"}}, {"a", "b", "c"})
    with pytest.raises(ConfigError, match=r"train.jsonl names tasks \['calc'\].*env.<task>"):
        check_tasks_configured({"train.jsonl": {"a", "calc"}, "val.jsonl": {"a"}}, {"a"})
