"""The output capture of a service (tandem/process_logs.py) in a real process: its last words
reach the log as JSON lines, and at exit it does not wait on multiprocessing's resource tracker
(a child that holds the capture pipe until the process is gone); `exit_now` skips the
interpreter's teardown but not a buffered line or the exit code."""

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import multiprocessing.resource_tracker as resource_tracker
    from tandem import process_logs

    process_logs.capture_output("probe")
    resource_tracker.ensure_running()  # what vLLM's semaphores start: it inherits the pipe as stderr
    print("last words", flush=True)
    process_logs._active.release()
    print("forwarder done" if process_logs._active.forwarder.poll() is not None else "forwarder waiting",
          flush=True)  # fds 1 and 2 are the real stderr again
""")


def test_the_last_words_arrive_and_the_exit_does_not_wait_on_the_resource_tracker():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    wrapped = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert {"service": "probe", "event": "output", "text": "last words"}.items() <= wrapped[0].items(), done.stderr
    assert done.stderr.splitlines()[-1] == "forwarder done", done.stderr


EXIT_SCRIPT = textwrap.dedent("""
    import logging, sys
    from tandem import process_logs

    process_logs.capture_output("probe")
    logging.basicConfig(stream=sys.stderr)
    sys.stdout.write("buffered, not flushed")  # no newline, no flush: os._exit alone would drop it
    logging.getLogger("probe").warning("a log record")
    process_logs.exit_now(3)
""")


def test_exit_now_keeps_the_exit_code_and_loses_no_line():
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=60,
                          check=False, env=buffered)
    assert done.returncode == 3, done.stderr
    text = "".join(json.loads(line).get("text", "") for line in done.stderr.splitlines() if line.startswith("{"))
    assert "buffered, not flushed" in text and "a log record" in text, done.stderr
