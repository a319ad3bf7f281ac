"""The code environment and its sandbox on ordinary programs: passing, failing, crashing,
looping forever; what the program sees from inside; the pieces (code extraction, ground
truth, seccomp filter). Hostile programs: test_sandbox_hostile.py."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from reward_svc.config import SandboxLimits
from reward_svc.envs import code
from reward_svc.sandbox import run_program, runner
from reward_svc.sandbox.seccomp import build_filter

LIMITS = SandboxLimits(cpu_s=1, wall_s=2.0, memory_bytes=256 << 20, max_processes=16)
ADD_TESTS = json.dumps({"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert candidate(2, 2) == 4"],
                        "entry_point": "add"})


def _score_all(completions: list[str], ground_truth: str = ADD_TESTS) -> list[code.CodeRun]:
    with ThreadPoolExecutor(len(completions)) as pool:
        return list(pool.map(lambda c: code.run_tests(c, ground_truth, LIMITS), completions))


def test_passing_failing_crashing_and_looping_code():
    runs = _score_all([
        "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.",       # passes all
        "def add(a, b):\n    return a + b if a >= 0 else 7",                               # fails one
        "def add(a, b):\n    return a + b\nraise RuntimeError('boom')",                    # crashes after defining
        "import ctypes\nctypes.string_at(0)",                                              # segfaults
        "def add(a, b):\n    while True:\n        pass",                                   # loops forever
        "import time\ndef add(a, b):\n    if a < 0:\n        time.sleep(100)\n    return a + b",  # hangs on test 2
    ])
    assert [sorted(r.passed) for r in runs] == [[0, 1, 2], [0, 2], [0, 1, 2], [], [], [0]]
    # the completion runs in a process of its own under the harness: its fate is solution_exit
    assert runs[3].solution_exit == -11 and runs[3].sandbox.exit_code == 0
    # RLIMIT_CPU kills the completion's process, or on a busy machine the wall clock the sandbox
    assert -9 in (runs[4].solution_exit, runs[4].sandbox.exit_code) and runs[4].sandbox.cpu_s < LIMITS.cpu_s + 0.5
    assert runs[5].sandbox.timed_out and runs[5].sandbox.wall_s < LIMITS.wall_s + 1.0       # wall clock
    assert "RuntimeError: boom" in runs[2].sandbox.output


def test_score_is_the_pass_fraction():
    result = code.score("def add(a, b):\n    return a + b if a >= 0 else 7", ADD_TESTS, LIMITS)
    assert result.reward == pytest.approx(2 / 3) and not result.correct
    assert code.score("def add(a, b): return a + b", ADD_TESTS, LIMITS).correct


def test_what_the_program_sees():
    probe = r"""
import json, os, resource, socket
limits = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n))
          for n in ("CPU", "AS", "NPROC", "FSIZE", "NOFILE", "CORE")}
report = {"limits": limits, "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "env": dict(os.environ),
          "cwd": os.getcwd(), "root": sorted(os.listdir("/")), "tmp": os.listdir("."), "pids": sorted(
          p for p in os.listdir("/proc") if p.isdigit()), "hostname": socket.gethostname(),
          "ifaces": [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]],
          "stdin": os.read(0, 10).decode()}
open("mine.txt", "w").write("x")
report["read_only"] = [bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in ("/", "/usr", "/tmp")]
os.write(4, json.dumps(report).encode())
"""
    first, second = (run_program(probe, LIMITS) for _ in range(2))
    seen = json.loads(first.reports)
    assert seen["uid"] >= runner.UID_BASE and seen["gid"] == seen["uid"] and seen["groups"] == []
    assert set(seen["env"]) <= {"LC_CTYPE"}  # only what the interpreter sets itself
    assert seen["cwd"] == "/tmp" and seen["tmp"] == [] and json.loads(second.reports)["tmp"] == []  # private, fresh
    assert set(seen["root"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "main.py", "proc", "root", "sbin",
                                 "tmp", "usr"}
    assert seen["pids"] == ["1"] and seen["hostname"] == "sandbox" and seen["ifaces"] == ["lo"]
    assert seen["stdin"] == "" and seen["read_only"] == [True, True, False]
    assert seen["limits"] == {"CPU": [1, 1], "AS": [256 << 20] * 2, "NPROC": [16, 16], "FSIZE": [1 << 20] * 2,
                              "NOFILE": [64, 64], "CORE": [0, 0]}


def test_output_is_truncated_and_input_arrives():
    result = run_program("import os, sys\nsys.stdout.write(os.read(3, 100).decode() * 10**6)", LIMITS,
                         input_text="ab")
    assert result.exit_code == 0 and result.output_truncated
    assert len(result.output) == LIMITS.output_bytes and result.output.startswith("abab")


def test_a_sandbox_that_cannot_be_built_never_runs_the_program(monkeypatch):
    monkeypatch.setattr(runner, "UID_BASE", 2**32)  # no such uid: dropping privileges fails
    started = time.monotonic()
    with pytest.raises(code.SandboxUnavailable, match="OSError"):
        code.run_tests("def add(a, b): return a + b", ADD_TESTS, LIMITS)
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("completion,expected", [
    ("```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2\n"),
    ("```py\nx = 1\n```", "x = 1\n"),
    ("```\nx = 3\n```", "x = 3\n"),
    ("```text\nno\n```\n```python\nx = 4\n```", "x = 4\n"),
    ("x = 5", "x = 5"),
])
def test_extract_code(completion, expected):
    assert code.extract_code(completion) == expected


@pytest.mark.parametrize("ground_truth,message", [
    ("assert f(1) == 2", "must be JSON"),
    ('{"tests": []}', "non-empty list"),
    ('{"tests": "assert True"}', "non-empty list"),
    ('{"tests": ["assert True"], "entry_point": "not an identifier"}', "identifier"),
    ('{"tests": ["assert True"], "timeout": 3}', "only the keys"),
])
def test_bad_ground_truth_is_a_clear_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        code.parse_ground_truth(ground_truth)


def test_seccomp_filter_is_built_per_architecture():
    for machine in ("x86_64", "aarch64"):
        program = build_filter(machine)
        assert len(program) % 8 == 0 and 0 < len(program) // 8 < 4096  # BPF_MAXINSNS
    with pytest.raises(RuntimeError, match="riscv64"):
        build_filter("riscv64")
