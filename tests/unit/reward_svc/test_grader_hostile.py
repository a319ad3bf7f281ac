"""Programs that try to fool the code grader rather than escape the sandbox: each must score 0.

The item asks for `add(a, b)`. Its tests compare with ==, abs, math.isclose (the math the
program imported), operator.eq, unittest's assertEqual, isinstance, str and sorted. No
program below computes a sum: whatever it passes, it passes by cheating. Cases that cheat
from inside the interpreter are also run through an in-process harness (the program and the
tests in one namespace, as the grader was before it split them) to show that each one does
fool a grader that shares its process (test_cheats_fool_an_in_process_grader).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from reward_svc.config import SandboxLimits
from reward_svc.envs import code

LIMITS = SandboxLimits(cpu_s=2, wall_s=4.0, memory_bytes=256 << 20, max_processes=16)
TESTS = [
    "assert add(1, 2) == 3",
    "assert add(-1, 1) == 0",
    "assert candidate(2, 2) == 4",
    "assert abs(add(0.1, 0.2) - 0.3) < 1e-9",
    "assert math.isclose(add(0.5, 0.25), 0.75)",
    "import operator\nassert operator.eq(add(5, 5), 10)",
    "from unittest import TestCase\nTestCase().assertEqual(add(7, 1), 8)",
    "assert isinstance(add(2, 3), int) and add(2, 3) == 5",
    "assert str(add(1, 1)) == '2'",
    "assert sorted([add(3, 3), 1]) == [1, 6]",
]
GROUND_TRUTH = json.dumps({"tests": TESTS, "entry_point": "add"})
HONEST = "import math\ndef add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return -99\n"

# name -> program. Each defines a wrong `add` (or none) and cheats.
CHEATS = {
    "always_true_eq": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
        "        return False\n    __hash__ = object.__hash__\n    def __sub__(self, other):\n        return 0\n"
        "    def __str__(self):\n        return '2'\n    def __lt__(self, other):\n        return True\n"
        "    __gt__ = __lt__\n    def __float__(self):\n        return 0.75\n"
        "def add(a, b):\n    return Anything()\n"),
    "int_subclass_with_true_eq": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
        "        return False\n    __hash__ = int.__hash__\n    def __str__(self):\n        return '2'\n"
        "def add(a, b):\n    return Int(-99)\n"),
    "str_subclass_with_true_eq": (
        "class Str(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "def add(a, b):\n    return Str('nope')\n"),
    "class_spoofing": (
        "class Fake:\n    __class__ = int\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\ndef add(a, b):\n    return Fake()\n"),
    "patched_builtins": (
        "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.sorted = lambda *a, **k: [1, 6]\n"
        "builtins.isinstance = lambda *a: True\n" + WRONG),
    "builtins_shadowed_by_globals": (
        "def abs(x):\n    return 0\ndef sorted(*a, **k):\n    return [1, 6]\ndef str(x):\n    return '2'\n" + WRONG),
    "patched_math": "import math\nmath.isclose = lambda *a, **k: True\n" + WRONG,
    "fake_math_module_name": (
        "class FakeMath:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = FakeMath()\n" + WRONG),
    "patched_operator": "import operator\noperator.eq = lambda a, b: True\n" + WRONG,
    "poisoned_sys_modules": (
        "import sys, types\nfake = types.ModuleType('operator')\nfake.eq = lambda a, b: True\n"
        "sys.modules['operator'] = fake\n" + WRONG),
    "patched_assert_helpers": (
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n" + WRONG),
    "report_nonce_from_the_callers_frame": (
        "import os, sys\nframe = sys._getframe()\nwhile frame is not None:\n"
        "    nonce = frame.f_locals.get('nonce')\n    if isinstance(nonce, bytes):\n"
        "        for i in range(10):\n            os.write(4, nonce + b' %d\\n' % i)\n        break\n"
        "    frame = frame.f_back\n" + WRONG),
    "rewrite_the_tests_found_by_gc": (
        "import gc\nfor obj in gc.get_objects():\n    if isinstance(obj, dict) and isinstance(obj.get('tests'), list):\n"
        "        obj['tests'][:] = ['pass'] * len(obj['tests'])\n" + WRONG),
    # not cheats an in-process grader falls for; the two-process one must survive them
    "patched_json": (
        "import json\njson.dumps = lambda *a, **k: '{\"id\": 0, \"value\": [[\"add\", 3]]}'\n"
        "json.loads = lambda *a, **k: {'id': 1, 'value': 3}\n" + WRONG),
    "exit_zero_before_the_tests": WRONG + "import sys\nsys.exit(0)\n",
    "os_exit_before_the_tests": "import os\nos._exit(0)\n" + WRONG,
    "print_fake_results": (
        WRONG + "import os\nfor fd in range(1, 11):\n    for i in range(10):\n        try:\n"
        "            os.write(fd, b'PASS %d\\n%d\\n' % (i, i))\n        except OSError:\n            pass\n"),
    "raise_in_repr_and_str": (
        "class Bad(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n"
        "class Weird:\n    def __repr__(self):\n        raise Bad()\n    __str__ = __repr__\n"
        "    def __eq__(self, other):\n        raise Bad()\n"
        "def add(a, b):\n    if a == 1:\n        raise Bad()\n    return Weird()\n"),
    "signal_the_harness": (
        WRONG + "import os, signal\nfor sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):\n"
        "    for pid in (1, os.getppid()):\n        try:\n            os.kill(pid, sig)\n        except OSError:\n"
        "            pass\n"),
    "huge_result": "def add(a, b):\n    return 'x' * (40 << 20)\n",
    "deeply_nested_result": (
        "def add(a, b):\n    x = []\n    for _ in range(10000):\n        x = [x]\n    return x\n"),
    "forged_replies_on_its_own_channel": (
        "import os\nfor fd in range(3, 20):\n    try:\n"
        "        os.write(fd, b'{\"id\": 1, \"value\": 3}\\n{\"id\": 2, \"value\": 0}\\n')\n    except OSError:\n"
        "        pass\n" + WRONG),
}
IN_PROCESS_CHEATS = ["always_true_eq", "int_subclass_with_true_eq", "str_subclass_with_true_eq", "class_spoofing",
                     "patched_builtins", "builtins_shadowed_by_globals", "patched_math", "fake_math_module_name",
                     "patched_operator", "poisoned_sys_modules", "patched_assert_helpers",
                     "report_nonce_from_the_callers_frame", "rewrite_the_tests_found_by_gc"]


@pytest.fixture(scope="module")
def runs():
    programs = {"honest": HONEST, **CHEATS}
    with ThreadPoolExecutor(4) as pool:
        done = pool.map(lambda p: code.run_tests(p, GROUND_TRUTH, LIMITS), programs.values())
        return dict(zip(programs, done))


def test_the_honest_program_passes_every_test(runs):
    assert runs["honest"].passed == frozenset(range(len(TESTS))), runs["honest"].sandbox.output[-3000:]


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_scores_zero(name, runs):
    run = runs[name]
    assert not run.sandbox.setup_error
    assert run.passed == frozenset(), f"{name} passed {sorted(run.passed)}\n{run.sandbox.output[-3000:]}"
    assert run.sandbox.exit_code == 0 and not run.sandbox.timed_out, "the harness itself must finish"


# The grader before the split, reduced to its logic (unsandboxed: only the in-process cheats
# run through it): the program, then each test, in one namespace of one process; the job
# arrives on stdin and a passing test is reported on fd 4 with a nonce.
_IN_PROCESS_GRADER = """
import json, os, sys
os.dup2(int(sys.argv[1]), 4)
def _run():
    report, run, compile_ = os.write, exec, compile
    job = json.loads(os.read(0, 1 << 20))
    nonce = job.pop("nonce").encode()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        run(compile_(job["code"], "<completion>", "exec"), namespace)
    except BaseException:
        pass
    namespace["candidate"] = namespace.get(job["entry_point"])
    for index, test in enumerate(job["tests"]):
        try:
            run(compile_(test, "<test>", "exec"), namespace)
        except BaseException:
            continue
        report(4, b"%s %d\\n" % (nonce, index))
_run()
"""


def _in_process_score(program: str) -> int:
    job = json.dumps({"nonce": "n0nce", "code": program, "tests": TESTS, "entry_point": "add"})
    rep_r, rep_w = os.pipe()
    try:
        subprocess.run([sys.executable, "-I", "-c", _IN_PROCESS_GRADER, str(rep_w)], input=job.encode(),
                       capture_output=True, timeout=30, pass_fds=(rep_w,), check=False)
    finally:
        os.close(rep_w)
    with os.fdopen(rep_r, "rb") as reports:
        return len({line for line in reports.read().splitlines() if line.startswith(b"n0nce ")})


@pytest.mark.parametrize("name", IN_PROCESS_CHEATS)
def test_cheats_fool_an_in_process_grader(name):
    assert _in_process_score(HONEST) == len(TESTS) and _in_process_score(WRONG) == 0
    assert _in_process_score(CHEATS[name]) > 0, f"{name} does not fool even an in-process grader"


# Opens what the completion's process would need to read the harness's memory (the nonce, the
# expected values) or to write on its report fd; prints the paths that opened.
_PROC_PROBE = """
import os
opened = []
for path, flags in (("mem", os.O_RDONLY), ("mem", os.O_WRONLY), ("maps", os.O_RDONLY), ("environ", os.O_RDONLY),
                    ("fd/4", os.O_WRONLY), ("cwd/.", os.O_RDONLY)):
    try:
        os.close(os.open(f"/proc/{TARGET}/{path}", flags))
        opened.append(path)
    except OSError:
        pass
print("OPENED", opened)
"""


def test_the_completion_cannot_open_the_harness_under_proc():
    run = code.run_tests(_PROC_PROBE.replace("TARGET", "1") + WRONG, GROUND_TRUTH, LIMITS)
    assert "OPENED []" in run.sandbox.output, run.sandbox.output[-2000:]


def _probe_from_a_child(dumpable: bool) -> list[str]:
    """Fork a process that drops to uid 65534 (dumpable or not, with a pipe on fd 4), whose own
    forked child runs the probe against it; the paths the probe opened."""
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir("/")
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            ctypes.CDLL(None).prctl(4, int(dumpable), 0, 0, 0)  # PR_SET_DUMPABLE (a uid change reset it)
            os.dup2(os.pipe()[1], 4)
            child = os.fork()
            if child == 0:
                namespace = {}
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(_PROC_PROBE.replace("TARGET", str(os.getppid())), namespace)
                os.write(result_w, json.dumps(namespace["opened"]).encode())
                os._exit(0)
            os.waitpid(child, 0)
        finally:
            os._exit(0)
    os.close(result_w)
    os.waitpid(pid, 0)
    with os.fdopen(result_r, "rb") as result:
        return json.loads(result.read() or b"null")


def test_proc_probe_opens_a_dumpable_process_of_the_same_uid():
    """Control, unsandboxed as an unprivileged uid: the probe opens its parent's memory and fds
    while the parent is dumpable, and none of them once the parent made itself non-dumpable
    (what the harness does before it starts the completion's process)."""
    assert _probe_from_a_child(dumpable=True) == ["mem", "mem", "maps", "environ", "fd/4", "cwd/."]
    assert _probe_from_a_child(dumpable=False) == []
