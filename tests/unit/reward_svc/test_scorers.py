import pytest

from reward_svc.envs import exact, math


@pytest.mark.parametrize("completion,answer,correct", [
    ("46", "46", True), (" 46\n", "46", True), ("46\n12", "46", True), ("47", "46", False), ("", "46", False),
    ("4 6", "46", False),
])
def test_exact(completion, answer, correct):
    result = exact.score(completion, answer)
    assert result.correct is correct and result.reward == float(correct)


@pytest.mark.parametrize("completion,answer,correct", [
    (r"The answer is \boxed{42}.", "42", True),
    (r"$\frac{1}{2}$", "0.5", True),
    ("so we get 0.5", r"\frac{1}{2}", True),
    (r"\boxed{41}", "42", False),
    ("no idea", "42", False),
])
def test_math_verify(completion, answer, correct):
    assert math.score(completion, answer).correct is correct


def test_math_rejects_unparsable_ground_truth():
    with pytest.raises(ValueError, match="ground truth"):
        math.score("1", "")
