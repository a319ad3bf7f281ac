"""The code environment's two-process harness on honest programs: what crosses between the
completion's process and the tests' (plain data, exact types, references to its objects),
and the Python idioms tests use that must keep working. Hostile programs:
test_grader_hostile.py (the grader) and test_sandbox_hostile.py (the sandbox)."""

import collections
import enum
import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from reward_svc.config import SandboxLimits
from reward_svc.envs import code
from reward_svc.envs.code_harness import decode, encode

LIMITS = SandboxLimits(cpu_s=2, wall_s=5.0, memory_bytes=256 << 20, max_processes=16)


def _same(a, b) -> bool:
    """Equal, and of the same exact type all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b or (math.isnan(a) and math.isnan(b)) if type(a) is float else a == b


def _round_trip(value):
    return decode(json.loads(json.dumps(encode(value))))


@pytest.mark.parametrize("value", [
    None, True, False, 0, -5, 2 ** 200, 1.5, -0.0, float("inf"), float("nan"), "tab\tnew\nline", b"\x00\xff",
    bytearray(b"ab"), 1 + 2j, [], (), set(), frozenset(), (1, [2, (3,)], {4}), {"a": (1, 2), 3: frozenset({4}), None: []},
    {(1, 2): b"k"}, [True, 1, 1.0],
])
def test_plain_data_crosses_with_its_exact_types(value):
    assert _same(_round_trip(value), value)


class _Colour(enum.IntEnum):
    RED = 1


def test_subclasses_of_plain_types_cross_as_their_plain_value():
    point = collections.namedtuple("Point", "x y")(1, 2)
    crossed = _round_trip([collections.Counter("aab"), point, _Colour.RED, collections.OrderedDict(a=1)])
    assert _same(crossed, [{"a": 2, "b": 1}, (1, 2), 1, {"a": 1}])


def test_other_objects_cross_only_as_references():
    class Anything:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError, match="only plain data"):
        encode(Anything())
    assert encode([Anything()], share=lambda obj: 7) == ["l", [["r", 7, "Anything"]]]


@pytest.mark.parametrize("data", [
    {"a": 1}, ["zz", 1], ["l", 1], ["l", [], 0], ["r", 1, "T"], ["d", [[1]]], ["c", ["1", 2]], ["b", "zz"],
    ["s", [["l", []]]], ["d", [[["l", []], 1]]],
])
def test_decode_refuses_what_is_not_plain_data(data):
    with pytest.raises((ValueError, TypeError)):
        decode(data)


def test_decode_refuses_data_nested_past_the_limit():
    deep = ["l", []]
    for _ in range(100):
        deep = ["l", [deep]]
    assert len(str(decode(deep))) == 2 * 101
    with pytest.raises(ValueError, match="nested deeper"):
        decode(["l", [deep]])


# (completion, tests, entry_point, tests expected to pass)
_IDIOMS = {
    "tuple_is_not_list": ("def pair():\n    return (1, 2)",
                          ["assert pair() == (1, 2)", "assert pair() != [1, 2]", "assert type(pair()) is tuple"],
                          None, {0, 1, 2}),
    "counter_equals_dict": ("from collections import Counter\ndef count(s):\n    return Counter(s)",
                            ["assert count('aab') == {'a': 2, 'b': 1}"], None, {0}),
    "builtin_exceptions_keep_their_type": (
        "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x",
        ["try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    assert False",
         "assert f(3) == 3"], None, {0, 1}),
    "class_based_solution": (
        ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
         "        for i, n in enumerate(nums):\n            if target - n in seen:\n"
         "                return [seen[target - n], i]\n            seen[n] = i"),
        ["assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]", "s = Solution()\nassert s.twoSum([3, 3], 6) == [0, 1]"],
        None, {0, 1}),
    "generator": ("def gen(n):\n    yield from range(n)", ["assert list(gen(3)) == [0, 1, 2]",
                                                           "assert sum(x * x for x in gen(4)) == 14"], None, {0, 1}),
    "in_place_mutation": ("def sort_in_place(xs):\n    xs.sort()\ndef put(d, k):\n    d[k] = 1",
                          ["xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
                           "d = {}\nput(d, k='a')\nassert d == {'a': 1}"], None, {0, 1}),
    "humaneval_check": ("def add(a, b):\n    return a + b",
                        [("def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n"
                          "check(add)"), "assert candidate(1, 1) == 2"], "add", {0, 1}),
    "mbpp_math_from_the_solution": ("import math\ndef area(r):\n    return math.pi * r * r",
                                    ["assert math.isclose(area(1), 3.141592653589793)"], None, {0}),
    "objects_stay_in_the_solution": (
        ("class Node:\n    def __init__(self, val, nxt=None):\n        self.val, self.next = val, nxt\n"
         "def build(xs):\n    head = None\n    for x in reversed(xs):\n        head = Node(x, head)\n    return head\n"
         "def to_list(node):\n    out = []\n    while node:\n        out.append(node.val)\n        node = node.next\n"
         "    return out"),
        ["assert to_list(build([1, 2, 3])) == [1, 2, 3]", "assert build([4]).val == 4",
         "node = build([5, 6])\nassert node.next.val == 6", "assert build([]) is None",
         "assert build([1]) == build([1])", "n = build([1])\nassert n is not None and n is n"],
        None, {0, 1, 2, 3, 5}),
    "prints_and_reads_stdin": (("import sys\nprint('hello from the solution')\ndata = sys.stdin.read()\n"
                                "def f():\n    return data"), ["assert f() == ''"], None, {0}),
    "constants_and_big_numbers": (
        "MOD = 10**9 + 7\ndef f(x):\n    return x % MOD\ndef g():\n    return 2**200, 0.1 + 0.2, float('inf')",
        ["assert f(MOD + 1) == 1", "assert g() == (2**200, 0.30000000000000004, float('inf'))"], None, {0, 1}),
    "builtin_name_as_entry_point": ("def max(xs):\n    return sorted(xs)[-1]", ["assert max([1, 5, 2]) == 5"], "max", {0}),
    "keyword_arguments_and_nan": ("import math\ndef f(a, *, b=2):\n    return a * b\ndef nan():\n    return math.nan",
                                  ["assert f(3, b=4) == 12 and f(3) == 6", "import math\nassert math.isnan(nan())"],
                                  None, {0, 1}),
    "a_test_cannot_pass_a_callable": ("def apply(f, x):\n    return f(x)", ["assert apply(abs, -1) == 1"], None, set()),
}


@pytest.fixture(scope="module")
def idiom_runs():
    def run(item):
        completion, tests, entry_point, _ = item
        return code.run_tests(completion, json.dumps({"tests": tests, "entry_point": entry_point}), LIMITS)

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(_IDIOMS, pool.map(run, _IDIOMS.values())))


@pytest.mark.parametrize("name", list(_IDIOMS))
def test_honest_programs_keep_their_score(name, idiom_runs):
    run = idiom_runs[name]
    assert run.passed == _IDIOMS[name][3], run.sandbox.output[-3000:]
    assert run.sandbox.exit_code == 0 and not run.sandbox.timed_out


def test_the_solution_output_reaches_the_log(idiom_runs):
    assert "hello from the solution" in idiom_runs["prints_and_reads_stdin"].sandbox.output
    assert "cannot be compared" in idiom_runs["objects_stay_in_the_solution"].sandbox.output
