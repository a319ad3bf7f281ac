import pytest

from reward_svc.envs import exact, math


@pytest.mark.parametrize("completion,answer,correct", [
    ("46", "46", True), (" 46\n", "46", True), ("46\n12", "46", True), ("47", "46", False), ("", "46", False),
    ("4 6", "46", False),
])
def test_exact(completion, answer, correct):
    result = exact.score(completion, answer)
    assert result.correct is correct and result.reward == float(correct)


_MATH_CASES = [
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
]


@pytest.mark.parametrize("completion,answer,correct", _MATH_CASES)
def test_math_verify(completion, answer, correct):
    assert math.score(completion, answer).correct is correct


def test_math_rejects_unparsable_ground_truth():
    with pytest.raises(ValueError, match="ground truth"):
        math.score("1", "")


# NeMo-RL's math environment (hf_math_verify) reads the reference as "\boxed{" + answer + "}"
# with LaTeX extraction only, and the completion with expression then LaTeX extraction.
_NEMO_RL_GOLD_CASES = [
    (r"\boxed{5}", r"\$5", True),  # a LaTeX dollar sign inside the box is dropped
    (r"\boxed{12}", "The answer is 12", False),  # the whole reference is the answer, not its last number
    ("7", "7.", False),  # "\boxed{7.}" does not parse as a number
    (r"\boxed{\frac{1}{2}}", r"$\frac{1}{2}$", True),
    (r"\boxed{3}", r"\boxed{3}", True),  # a reference already boxed
    ("12", "12 ", True),
    (r"\boxed{1/2, 3}", r"$\frac{1}{2}$ and $3$", True),
    ("5", "5}", True),  # "\boxed{5}}": the box closes at the first brace
    ("{5", "{5", False),
    ("0.1", "10%", True),
]


@pytest.mark.parametrize("completion,answer,correct", _NEMO_RL_GOLD_CASES)
def test_math_reads_the_reference_as_nemo_rl_does(completion, answer, correct):
    assert math.score(completion, answer).correct is correct


def test_math_agrees_with_math_verify_metric_configured_as_nemo_rl():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig
    from math_verify.metric import math_metric

    nemo_rl = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                          pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    table = _MATH_CASES + _NEMO_RL_GOLD_CASES
    for completion, answer, _ in table:
        expected, _ = nemo_rl(["\\boxed{" + answer + "}"], [completion])
        assert math.score(completion, answer).reward == expected, (completion, answer)
