"""The sample ledger (coordinator/loop/ledger.py) and its checker `account` on hand-built records:
a clean history (with a stale drop sampled again, and dynamic sampling's drops) passes; a sample
trained twice, a draw lost, a sample older than the bound, a short batch, a missing or repeated
step, and a stale drop that was not stale each fail, named."""

import pytest

from coordinator.loop.ledger import Dropped, DropReason, GroupIds, StepSamples, account

G = 2  # generations per prompt


def group(draw: int, version: int) -> GroupIds:
    return GroupIds(draw, (version,) * G)


def clean() -> list[StepSamples]:
    """3 steps of 2 groups, async (age <= 1): step 2 dropped draw 3 as stale and trained it again at
    a new version; step 3 dropped draw 6 for zero variance and draw 8 as surplus."""
    return [
        StepSamples(1, 0, (group(0, 0), group(1, 0))),
        StepSamples(2, 3, (group(2, 2), group(3, 3)), (Dropped(group(3, 1), DropReason.STALE),)),
        StepSamples(3, 4, (group(4, 3), group(5, 3), ), (Dropped(group(6, 3), DropReason.ZERO_VARIANCE),
                                                         Dropped(group(7, 3), DropReason.SURPLUS))),
    ]


def check(records):
    return account(records, steps=3, groups=2, generations=G, max_age=1)


def test_a_clean_history_accounts_for_every_sample():
    assert check(clean()) == []


def test_records_survive_their_json_line():
    assert [StepSamples.from_json(r.to_json()) for r in clean()] == clean()
    assert clean()[1].to_json() == {"step": 2, "trainer_version": 3, "trained": [[2, [2, 2]], [3, [3, 3]]],
                                    "dropped": [[3, [1, 1], "stale"]]}


def _replace(records, index, record):
    return [record if i == index else r for i, r in enumerate(records)]


@pytest.mark.parametrize("records, problem", [
    # draw 1 trained again in step 3 (instead of draw 5): a resume that drew it twice
    (lambda r: _replace(r, 2, StepSamples(3, 4, (group(4, 3), group(1, 3)), r[2].dropped)),
     "sample (draw 1, generation 0) trained twice: steps 1 and 3"),
    # draw 5 neither trained nor dropped: step 3 trained draw 9 instead
    (lambda r: _replace(r, 2, StepSamples(3, 4, (group(4, 3), group(9, 3)), r[2].dropped)),
     "draws lost (neither trained nor dropped): [5, 8]"),
    # a sample two versions old under a bound of one
    (lambda r: _replace(r, 1, StepSamples(2, 3, (group(2, 1), group(3, 3)), r[1].dropped)),
     "step 2: draw 2 trained 2 versions old (bound 1)"),
    # one sample of a group missing: a short batch
    (lambda r: _replace(r, 0, StepSamples(1, 0, (group(0, 0), GroupIds(1, (0,))))),
     "step 1: trained 3 samples in 2 groups, not 4 in 2"),
    # a step missing from the history
    (lambda r: r[:1] + r[2:], "steps recorded twice [], missing [2]"),
    # a step recorded twice (a restart's lines not dropped)
    (lambda r: r + r[2:], "steps recorded twice [3], missing []"),
    # a "stale" drop of a sample within the bound
    (lambda r: _replace(r, 1, StepSamples(2, 3, r[1].trained, (Dropped(group(3, 2), DropReason.STALE),))),
     "step 2: draw 3 dropped as stale at age 1 (bound 1)"),
])
def test_a_broken_history_is_named(records, problem):
    problems = check(records(clean()))
    assert problem in problems, problems


def test_a_resume_keeps_the_records_up_to_its_checkpoint(tmp_path):
    """coordinator/checkpoint/resume.py truncate_ledger: the lines of steps after the checkpoint
    (trained again by the resumed run) and a line cut by a death go; a missing ledger stays missing."""
    import json

    from coordinator.checkpoint.resume import truncate_ledger

    path = tmp_path / "ledger.jsonl"
    truncate_ledger(path, 2)
    assert not path.exists()
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in clean()) + '{"step": 4, "trai')
    truncate_ledger(path, 2)
    assert [StepSamples.from_json(json.loads(line)) for line in path.read_text().splitlines()] == clean()[:2]
