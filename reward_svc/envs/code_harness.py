"""Test harness for the code environment. Not imported by the service: its source is the
program that reward_svc/envs/code.py runs in the sandbox (python -I -S, stdlib only).

Two processes, so that nothing the completion's code does can change how its tests judge it:

- the harness (this program; pid 1 of the sandbox; runs only the item's tests): reads the job
  (JSON: nonce, code, tests, entry_point) from fd 3, makes itself non-dumpable (so the other
  process cannot open its memory or its fds under /proc; ptrace is refused by seccomp anyway),
  starts the solution process, runs each test in a namespace of its own and reports each
  passing test on fd 4 as b"<nonce> <index>\\n", then b"<nonce> exit <how the solution
  process ended>\\n". The nonce and the tests never reach the solution process.
- the solution process (`main.py --solution`): runs the completion's code once in a fresh
  `__main__` namespace, then answers the harness's requests (call, getattr, iter, next)
  about the objects that code made. Its stdin and stdout are the two request/reply pipes
  (moved off fds 0 and 1 before the code runs: it sees /dev/null and the output).

The tests see the completion's top-level names as plain data (copies) or as a `Remote`
(calls run in the solution process), except that a stdlib module's name (`math`...) is the
harness's own import of it and a builtin's name stays the builtin (unless it is the entry
point), whatever the code bound to them; other modules are left out. Values cross as JSON of
plain types (`encode`) and the harness rebuilds them as exact builtin types (a subclass of
int arrives as its int value): an always-true __eq__, patched builtins, math, operator or
json, a fake report or an early exit change nothing where the tests compare. A `Remote`
cannot be compared, hashed by value or truth-tested. Lists, dicts, sets and bytearrays passed
to a call come back updated in place. Only plain data and Remotes cross: not a callable.
"""

import builtins
import json
import os
import select
import signal
import sys
import traceback

MAX_DEPTH = 100
MAX_REPLY_BYTES = 32 << 20
_SCALARS = (type(None), bool, int, float, str)
_SEQUENCES = {list: "l", tuple: "t", set: "s", frozenset: "fs"}
_BUILD = {"l": list, "t": tuple, "s": set, "fs": frozenset}
_PLAIN_BASES = (int, float, str, bytes, tuple, list, dict, set, frozenset)
_MUTABLE = (list, dict, set, bytearray)
_NEVER_IMPORT = {"antigravity", "this"}
_BUILTIN_NAMES = frozenset(dir(builtins))


class SolutionError(Exception):
    """The solution raised an exception that is not one of Python's builtin ones, or its
    process is gone, or it answered with something that is not plain data."""


def encode(value, share=None, depth=0):
    """`value` as JSON-ready plain data; a value that is not plain data goes through
    `share(value) -> id` and crosses as a reference (no `share`: TypeError)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"data nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind in _SEQUENCES:
        return [_SEQUENCES[kind], [encode(v, share, depth + 1) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, share, depth + 1), encode(v, share, depth + 1)] for k, v in value.items()]]
    if kind in (bytes, bytearray):
        return ["b" if kind is bytes else "ba", value.hex()]
    if kind is complex:
        return ["c", [value.real, value.imag]]
    for base in _PLAIN_BASES:  # a subclass crosses as its plain value, without its methods
        if isinstance(value, base):
            return encode(base(value), share, depth)
    if share is None:
        raise TypeError(f"a {kind.__name__} cannot cross to the solution: only plain data and its own objects")
    return ["r", share(value), kind.__name__]


def decode(data, remote=None, depth=0):
    """Plain data from `encode`'s JSON, as exact builtin types; ValueError or TypeError on
    anything else. `remote(id, type_name)` makes a reference's stand-in (None: refused)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"data nested deeper than {MAX_DEPTH} levels")
    if type(data) in _SCALARS:
        return data
    if type(data) is not list or len(data) != (3 if data[:1] == ["r"] else 2) or type(data[0]) is not str:
        raise ValueError(f"not plain data: {str(data)[:200]}")
    tag, body = data[0], data[1]
    if tag in _BUILD and type(body) is list:
        return _BUILD[tag](decode(v, remote, depth + 1) for v in body)
    if tag == "d" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
        return {decode(k, remote, depth + 1): decode(v, remote, depth + 1) for k, v in body}
    if tag in ("b", "ba") and type(body) is str:
        return (bytes if tag == "b" else bytearray).fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    if tag == "r" and remote is not None and type(body) is int and type(data[2]) is str:
        return remote(body, data[2])
    raise ValueError(f"not plain data: {str(data)[:200]}")


def _send(fd, message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _flush_output():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: B036 - whatever the code did to them
            pass


def _error(exc):
    try:
        text = str(exc)[:2000]
    except BaseException:  # noqa: B036 - a __str__ that raises
        text = "<unprintable>"
    return [type(exc).__name__, text]


def solution_main():
    """The solution process (untrusted): the completion's code, then its answers."""
    requests, replies = os.fdopen(os.dup(0), "rb"), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    code = json.loads(requests.readline())["code"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, "<completion>", "exec"), namespace)
    except BaseException:  # noqa: B036 - a crash or sys.exit in the code fails its tests, not the harness
        traceback.print_exc()
    objects = {}

    def share(value):
        objects[id(value)] = value
        return id(value)

    manifest = []
    for name, value in list(namespace.items()):
        if not name.startswith("__"):
            try:
                module = type(value) is type(os) and value.__name__
                manifest.append([name, ["m", module] if module else encode(value, share)])
            except Exception:  # noqa: BLE001 - a name that cannot cross is left out
                pass
    _flush_output()
    _send(replies, {"id": 0, "value": manifest})
    for line in requests:
        request = json.loads(line)
        try:
            reply = {"id": request["id"], **_answer(request, objects, share)}
        except BaseException as exc:  # noqa: B036 - SystemExit in a call is an error of that call
            reply = {"id": request["id"], "error": _error(exc)}
        _flush_output()
        _send(replies, reply)


def _answer(request, objects, share):
    target = objects[request["target"]]
    op = request["op"]
    if op == "getattr":
        return {"value": encode(getattr(target, request["name"]), share)}
    if op == "iter":
        return {"value": encode(iter(target), share)}
    if op == "next":
        return {"value": encode(next(target), share)}
    args = [decode(a, lambda rid, _: objects[rid]) for a in request["args"]]
    kwargs = {k: decode(v, lambda rid, _: objects[rid]) for k, v in request["kwargs"]}
    value = encode(target(*args, **kwargs), share)
    after = [[i, encode(a, share)] for i, a in enumerate(args) if type(a) in _MUTABLE]
    after += [[k, encode(v, share)] for k, v in kwargs.items() if type(v) in _MUTABLE]
    return {"value": value, "after": after}


class Remote:
    """An object of the solution process: attributes, calls and iteration run there."""

    __slots__ = ("_id", "_solution", "_type")

    def __init__(self, solution, rid, type_name):
        object.__setattr__(self, "_solution", solution)
        object.__setattr__(self, "_id", rid)
        object.__setattr__(self, "_type", type_name)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._solution.request({"op": "getattr", "target": self._id, "name": name})

    def __call__(self, *args, **kwargs):
        return self._solution.call(self._id, args, kwargs)

    def __iter__(self):
        return self._solution.request({"op": "iter", "target": self._id})

    def __next__(self):
        return self._solution.request({"op": "next", "target": self._id})

    def _refuse(self, *_):
        raise TypeError(f"a {self._type} of the solution is not plain data: it cannot be compared or tested")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = _refuse
    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self._type} of the solution>"


class Solution:
    """The solution process, seen from the harness: one request, one reply, in order."""

    def __init__(self, program, code):
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        self.pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-B", program, "--solution"], {},
                                  file_actions=[(os.POSIX_SPAWN_DUP2, req_r, 0), (os.POSIX_SPAWN_DUP2, rep_w, 1)])
        os.close(req_r)
        os.close(rep_w)
        self._pidfd = os.pidfd_open(self.pid)
        self._buffer, self._next_id, self._remotes, self.gone = bytearray(), 1, {}, None
        self._write({"code": code})

    def manifest(self):
        """[[name, data], ...]: the completion's top-level names (data not decoded yet)."""
        return self._reply(0)["value"]

    def request(self, message):
        """Send one request; its reply's value, decoded (the solution's exception re-raised)."""
        return self._exchange(message)[0]

    def call(self, rid, args, kwargs):
        message = {"op": "call", "target": rid, "args": [encode(a, self._share) for a in args],
                   "kwargs": [[k, encode(v, self._share)] for k, v in kwargs.items()]}
        value, after = self._exchange(message)
        for key, new in after:  # the solution's in-place changes to list/dict/set/bytearray arguments
            old = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
            if type(old) is type(new) and type(old) in _MUTABLE:
                _replace_contents(old, new)
        return value

    def _share(self, value):
        if type(value) is not Remote or value._solution is not self:
            raise TypeError(f"a {type(value).__name__} cannot cross to the solution: only plain data and its own objects")
        return value._id

    def _remote(self, rid, type_name):
        return self._remotes.setdefault(rid, Remote(self, rid, type_name))

    def _write(self, message):
        data = (json.dumps(message) + "\n").encode()
        while data and self.gone is None:
            dead, _, _ = select.select([self._pidfd], [self._req_w], [])
            if dead:
                self.gone = "exited"
                break
            try:
                data = data[os.write(self._req_w, data[:1 << 16]):]
            except OSError as exc:
                self.gone = f"its input pipe failed: {exc.strerror}"
        if self.gone is not None:
            raise SolutionError(f"the solution process is gone ({self.gone})")

    def _exchange(self, message):
        message["id"] = self._next_id
        self._next_id += 1
        self._write(message)
        reply = self._reply(message["id"])
        after = reply.get("after", [])
        return decode(reply["value"], self._remote), [(k, decode(v, self._remote)) for k, v in after]

    def _reply(self, expected_id):
        line = self._read_line()
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if type(reply) is not dict or type(reply.get("id")) is not int or reply["id"] != expected_id:
            self.gone = "it broke the reply protocol"
            raise SolutionError(f"the solution process is gone ({self.gone})")
        if "error" in reply:
            _raise_solution_error(reply["error"])
        return reply

    def _read_line(self):
        end = self._buffer.find(b"\n")
        while end < 0 and self.gone is None:
            if len(self._buffer) > MAX_REPLY_BYTES:
                self.gone = f"a reply longer than {MAX_REPLY_BYTES} bytes"
                break
            readable, _, _ = select.select([self._rep_r, self._pidfd], [], [])
            chunk = os.read(self._rep_r, 1 << 20) if self._rep_r in readable else None
            if chunk:
                newline = chunk.find(b"\n")
                end = -1 if newline < 0 else len(self._buffer) + newline
                self._buffer += chunk
            elif chunk == b"" or self._pidfd in readable:
                self.gone = "exited"
        if self.gone is not None:
            raise SolutionError(f"the solution process is gone ({self.gone})")
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        return line

    def stop(self):
        """How it ended: its exit code, or minus the signal that killed it; None when it was
        still running (it is killed now)."""
        os.close(self._req_w)  # end of requests: it returns from its loop and exits
        # (and a process whose pipe just closed needs a moment before its exit status shows)
        if not select.select([self._pidfd], [], [], 0.5)[0]:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            return None
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _replace_contents(old, new):
    if type(old) in (list, bytearray):
        old[:] = new
    else:
        old.clear()
        old.update(new)


def _raise_solution_error(error):
    type_name, message = (error + ["", ""])[:2] if type(error) is list else ("?", "")
    cls = getattr(builtins, str(type_name), None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(str(message))
        except Exception:  # noqa: BLE001 - builtin exceptions that need more arguments
            exc = None
        if exc is not None:
            raise exc
    raise SolutionError(f"{type_name}: {message}")


def build_test_namespace(solution, entry_point):
    """The tests' globals: the completion's top-level names, as the module docstring says."""
    import importlib

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        manifest = solution.manifest()
    except Exception:  # noqa: BLE001 - nothing defined: every test that needs the code fails
        traceback.print_exc()
        return namespace
    for entry in manifest if type(manifest) is list else []:
        try:
            name, data = entry
            is_module = type(data) is list and data[:1] == ["m"]
            if name == entry_point and not is_module:
                namespace[name] = decode(data, solution._remote)
            elif name in sys.stdlib_module_names and name not in _NEVER_IMPORT:
                namespace[name] = importlib.import_module(name)  # `math` is math, whatever the code bound to it
            elif not (is_module or name in _BUILTIN_NAMES):  # the tests' builtins stay theirs
                namespace[name] = decode(data, solution._remote)
        except Exception:  # noqa: BLE001 - a name that does not decode is left out
            pass
    if entry_point is not None and entry_point in namespace:
        namespace["candidate"] = namespace[entry_point]
    return namespace


def _make_undumpable():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0 or libc.prctl(3, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, PR_GET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def harness_main():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 ignores what it has no handler for
    _make_undumpable()
    report = os.write
    chunks = []
    while chunk := os.read(3, 1 << 16):
        chunks.append(chunk)
    os.close(3)
    os.set_inheritable(4, False)
    job = json.loads(b"".join(chunks))
    nonce = job["nonce"].encode()
    solution = Solution(os.path.abspath(sys.argv[0]), job["code"])
    namespace = build_test_namespace(solution, job["entry_point"])
    for index, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"<test {index}>", "exec"), namespace)
        except BaseException:  # noqa: B036
            traceback.print_exc()
            continue
        report(4, b"%s %d\n" % (nonce, index))
    ended = solution.stop()
    if ended is not None:
        print(f"the solution process ended with {ended}" + (" (a signal)" if ended < 0 else ""), file=sys.stderr)
    report(4, b"%s exit %s\n" % (nonce, b"stopped" if ended is None else str(ended).encode()))


if __name__ == "__main__":
    solution_main() if sys.argv[1:] == ["--solution"] else harness_main()
