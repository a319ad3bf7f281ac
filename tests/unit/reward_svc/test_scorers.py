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
    # boxed
    (r"The answer is \boxed{\dfrac{3}{4}}", "0.75", True),
    (r"\boxed{-7}", "-7", True),
    (r"\boxed{7}", "-7", False),
    (r"\boxed{x = 3}", "3", True),
    (r"\boxed{(1, 2)}", "(1,2)", True),
    (r"\boxed{(2, 1)}", "(1,2)", False),
    # plain numbers
    ("The result is 12.", "12", True),
    ("The result is 12.5", "12", False),
    ("0.5", "1/2", True),
    # fractions
    ("so x = 1/2", "0.5", True),
    (r"\boxed{\frac{6}{8}}", r"\frac{3}{4}", True),
    (r"$\frac{1}{3}$", "0.333", False),
    # LaTeX
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{3\sqrt{2}}", r"\sqrt{8}", False),
    (r"\boxed{\pi}", r"\pi", True),
    (r"\boxed{3.14159}", r"\pi", False),
    (r"\boxed{2^{10}}", "1024", True),
    (r"\boxed{2^{10}}", "1000", False),
    (r"\(\frac{1}{2}\)", "1/2", True),
])
def test_math_verify(completion, answer, correct):
    assert math.score(completion, answer).correct is correct


def test_math_rejects_unparsable_ground_truth():
    with pytest.raises(ValueError, match="ground truth"):
        math.score("1", "")
