"""LLM-as-judge parsing and prompting (reward_svc/envs/judge.py); the judge's calls
through a real gateway are in test_gateway.py."""

from __future__ import annotations

import pytest

from reward_svc.envs.judge import Judge, UnparsableJudgement, parse_score


@pytest.mark.parametrize(("reply", "score"), [
    ("Score: 7", 0.7), ("score=10", 1.0), ("The answer is right.\nScore: 9/10", 0.9), ("SCORE 0", 0.0),
    ("Score: 3\nOn reflection, Score: 8", 0.8), (" 5 ", 0.5), ("6/10.", 0.6), ("Score: 2.5", 0.25)])
def test_scores_are_parsed_and_scaled(reply, score):
    assert parse_score(reply, 10) == pytest.approx(score)


@pytest.mark.parametrize(("reply", "error"), [
    ("I think it is good", "has no score"), ("", "has no score"), ("Score: 11", "outside 0..10"),
    ("Score: -1", "outside 0..10"), ("12 out of 10", "has no score")])
def test_an_unparsable_reply_is_a_clear_error_that_keeps_the_reply(reply, error):
    with pytest.raises(UnparsableJudgement, match=error) as failed:
        parse_score(reply, 10)
    assert failed.value.reply == reply


def test_the_prompt_fills_its_placeholders_and_a_bad_template_is_refused_at_construction():
    judge = Judge(template="Q:{question} A:{answer} R:{reference} 0-{max_score}?", max_score=1)
    assert judge.prompt("1+1", "2", "2") == "Q:1+1 A:2 R:2 0-1?"
    assert "{" not in Judge().prompt("q", "a", "r")
    with pytest.raises(ValueError, match=r"unknown placeholders \['response'\]"):
        Judge(template="{response}")
    with pytest.raises(ValueError, match="add {answer}"):
        Judge(template="{question}")
    with pytest.raises(ValueError, match="not a format string"):
        Judge(template="{answer")
    with pytest.raises(ValueError, match="max_score must be > 0"):
        Judge(max_score=0)
