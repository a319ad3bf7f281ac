"""A checkpoint's mark of the metric history (coordinator/checkpoint/history.py) and reading it back:
the rows it marks, as metrics.jsonl holds them; its own row from the checkpoint when the
coordinator died before logging it; an earlier run's rows in the same file left out; a file that
is missing, shorter or other than the one marked is an error that changes nothing; and an older
checkpoint that holds its rows itself still resumes."""

import json

import pytest

from coordinator.checkpoint.history import HistoryMark, HistoryMismatch, checkpoint_lines
from coordinator.checkpoint.resume import LoopState, history_lines
from coordinator.metrics.log import MetricsLog


def _logged(log: MetricsLog, steps: range) -> HistoryMark:
    """GRPO steps `steps` logged; the mark a checkpoint at the last one takes (before its row)."""
    mark = None
    for step in steps:
        row = {"phase": "grpo", "step": step, "time": 0.0, "loss": 1.0 / step}
        if step == steps[-1]:
            mark = HistoryMark.after(log.written(), row)
        log.log("grpo", step, {"loss": 1.0 / step, "time_step_s": 0.1})
    return mark


def _lines(log: MetricsLog) -> list[str]:
    return log.path.read_text().splitlines()


def test_the_rows_marked_are_read_back_as_written_and_later_ones_are_not(tmp_path):
    log = MetricsLog(tmp_path, logger=False)
    log.log("sft", 10, {"loss": 3.0})
    mark = _logged(log, range(1, 5))
    assert (mark.offset, mark.num_rows) == (0, 5) and mark.own_row["step"] == 4
    written = _lines(log)
    _logged(log, range(5, 8))
    with open(log.path, "a") as f:
        f.write('{"phase": "gr')  # cut by a crash
    lines = checkpoint_lines(log.path, mark)
    assert lines == written
    assert "time_step_s" in json.loads(lines[-1])  # metrics.jsonl's own row, not the checkpoint's copy

    log.restore(lines)
    assert _lines(log) == written and log.history == [json.loads(line) for line in written]
    again = _logged(log, range(5, 7))  # a mark after a restore counts the restored rows
    assert checkpoint_lines(log.path, again) == _lines(log)[:7]


def test_the_checkpoints_own_row_stands_in_when_it_was_never_logged(tmp_path):
    log = MetricsLog(tmp_path, logger=False)
    _logged(log, range(1, 3))
    mark = HistoryMark.after(log.written(), {"phase": "grpo", "step": 3, "time": 0.0, "loss": 0.5})  # then the coordinator died
    with open(log.path, "a") as f:
        f.write('{"phase": "grpo", "step": 3, "ti')  # or was writing it
    assert checkpoint_lines(log.path, mark) == [*_lines(log)[:2], json.dumps(mark.own_row)]


def test_an_earlier_runs_rows_in_the_same_file_are_not_the_checkpoints(tmp_path):
    earlier = MetricsLog(tmp_path, logger=False)
    _logged(earlier, range(1, 4))  # a run of the same name that stopped before any checkpoint
    log = MetricsLog(tmp_path, logger=False)  # a fresh run appends to its metrics.jsonl
    mark = _logged(log, range(1, 3))
    assert mark.offset > 0 and checkpoint_lines(log.path, mark) == _lines(log)[3:]
    log.restore(checkpoint_lines(log.path, mark))
    assert [json.loads(line)["step"] for line in _lines(log)] == [1, 2]


@pytest.mark.parametrize("damage, message", [
    (lambda path, lines: path.unlink(), "is missing"),
    (lambda path, lines: path.write_text("".join(line + "\n" for line in lines[:2])), "holds 2 of the 3 rows"),
    (lambda path, lines: path.write_text(""), "holds 0 of the 3 rows"),
    (lambda path, lines: path.write_text("".join(line.replace('"loss": 1.0', '"loss": 9.0') + "\n" for line in lines)),
     "are not those it saw"),
    (lambda path, lines: path.write_text("".join(line + "\n" for line in [*lines[:3], lines[2]])),
     r"grpo step 4\) is not line 4 .* \(grpo step 3 is\)"),
    (lambda path, lines: path.write_text("".join(line + "\n" for line in [*lines[:3], "{not json"])),
     "line 4 .* is not a metrics row"),
])
def test_a_metrics_file_that_is_not_the_marked_one_is_an_error_that_changes_nothing(tmp_path, damage, message):
    log = MetricsLog(tmp_path, logger=False)
    mark = _logged(log, range(1, 5))
    damage(log.path, _lines(log))
    before = log.path.read_bytes() if log.path.exists() else None
    with pytest.raises(HistoryMismatch, match=message) as raised:
        checkpoint_lines(log.path, mark, tmp_path / "step_000004")
    assert "step_000004" in str(raised.value) and "4 rows" in str(raised.value)
    assert (log.path.read_bytes() if log.path.exists() else None) == before


def test_the_state_holds_the_mark_and_an_older_one_with_its_rows_still_resumes(tmp_path):
    log = MetricsLog(tmp_path, logger=False)
    mark = _logged(log, range(1, 3))
    state = LoopState(step=2, weight_version=2, cursor={}, history=mark)
    saved = json.loads(json.dumps(state.to_json()))
    assert "metrics" not in saved and saved["history"]["num_rows"] == 2
    assert LoopState.from_json(saved) == state
    assert history_lines(log.path, tmp_path, LoopState.from_json(saved)) == _lines(log)

    rows = [{"phase": "grpo", "step": step, "time": 0.0, "loss": 1.0 / step} for step in (1, 2)]
    older = LoopState.from_json({"step": 2, "weight_version": 2, "cursor": {}, "metrics": rows})
    assert older.history is None
    assert [json.loads(line) for line in history_lines(tmp_path / "absent.jsonl", tmp_path, older)] == rows
