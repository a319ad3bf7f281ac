"""Test harness for the code environment. Not imported by the service: its source is the
program that reward_svc/envs/code.py runs in the sandbox (python -I -S, stdlib only).

Reads the job (JSON: nonce, code, tests, entry_point) from fd 3, runs the completion's code
once in a fresh `__main__` namespace, then each test in that namespace, and reports each
passing test on fd 4 as b"<nonce> <index>\\n". The completion never sees the nonce on any
channel it can read (no file, no argv, no environment): it only lives in this frame.
"""

import json
import os
import traceback


def _run():
    # bound before the completion runs: patching os.write or builtins.exec later changes nothing here
    report, run, compile_ = os.write, exec, compile
    chunks = []
    while chunk := os.read(3, 1 << 16):
        chunks.append(chunk)
    os.close(3)
    job = json.loads(b"".join(chunks))
    nonce = job.pop("nonce").encode()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        run(compile_(job["code"], "<completion>", "exec"), namespace)
    except BaseException:  # noqa: B036 - a crash or sys.exit in the completion fails its tests, not the harness
        traceback.print_exc()
    if job["entry_point"] is not None and job["entry_point"] in namespace:
        namespace["candidate"] = namespace[job["entry_point"]]
    for index, test in enumerate(job["tests"]):
        try:
            run(compile_(test, f"<test {index}>", "exec"), namespace)
        except BaseException:  # noqa: B036
            traceback.print_exc()
            continue
        report(4, b"%s %d\n" % (nonce, index))


_run()
