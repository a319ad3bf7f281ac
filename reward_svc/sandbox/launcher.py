"""Sandbox launcher: a standalone script (stdlib only) that `runner.py` starts as root with
`python -I -S launcher.py`. It reads one JSON job on stdin, builds the sandbox, runs the
program in it, enforces the wall clock and prints one JSON status line on stdout.

    launcher (root, host pid namespace)
      unshare(NEWNS | NEWNET | NEWPID | NEWIPC | NEWUTS), fork:
      child = pid 1 of a fresh pid namespace, still root:
        - parent-death signal SIGKILL (the namespace dies with the launcher)
        - a new root on a small tmpfs: /usr, /bin.., the interpreter's prefix and
          /etc/ld.so.cache bound read-only; its own /proc; /dev with null/zero/random/urandom;
          /tmp a size- and inode-limited tmpfs owned by the sandbox uid (the working dir);
          /main.py (the program, read-only); pivot_root into it and detach the old root
        - rlimits, then groups/gid/uid dropped to a uid of its own (base + launcher pid),
          which also leaves no capabilities
        - fds: 0 = /dev/null, 1 and 2 = the output pipe, 3 = the input pipe, 4 = results pipe
        - no_new_privs + seccomp filter, then execve(python -I -S -B /main.py) with env {}
      launcher: feeds the input pipe, waits on a pidfd until the program exits or the wall
      clock runs out (then SIGKILL: when a pid namespace's init dies, every process in it dies).

Runs as its own file because the sandboxed side must not import the project (-I -S).
"""

import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 1, 22, 38, 2
PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _c(text):
    return text.encode() if text is not None else None


def mount(source, target, fstype, flags, data=None):
    check(libc.mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data)), f"mount {target}")


def bind_readonly(source, target):
    mount(source, target, None, MS_BIND)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_root(job, uid):
    """Mount the sandbox's file tree at job['root_dir'] and pivot into it."""
    root, limits = job["root_dir"], job["limits"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    root_bytes = len(job["program"].encode()) + (1 << 20)  # main.py and a few empty dirs and mount points
    mount("tandem-sandbox", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=0755" % root_bytes)
    for path in job["readonly_paths"]:
        inside = root + path
        if os.path.islink(path):  # merged-/usr systems: /bin -> usr/bin
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            os.symlink(os.readlink(path), inside)
        elif os.path.isdir(path):
            os.makedirs(inside, mode=0o755, exist_ok=True)
            bind_readonly(path, inside)
        elif os.path.isfile(path):
            os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
            open(inside, "w").close()
            bind_readonly(path, inside)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(root + "/dev")
    mount("tandem-dev", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.mkdir(root + "/tmp")
    mount("tandem-tmp", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          "size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d" % (limits["tmpfs_bytes"], limits["tmpfs_inodes"], uid, uid))
    with open(root + "/main.py", "w", encoding="utf-8") as f:
        f.write(job["program"])
    os.chmod(root + "/main.py", 0o444)
    os.chdir(root)  # pivot_root(".", ".") stacks the old root on top; detaching it leaves the new one
    check(libc.syscall(PIVOT_ROOT_NR[os.uname().machine], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/tmp")


def set_limits(limits):
    for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_bytes"]),
                        ("RLIMIT_NPROC", limits["max_processes"]), ("RLIMIT_FSIZE", limits["file_size_bytes"]),
                        ("RLIMIT_NOFILE", limits["open_files"]), ("RLIMIT_CORE", 0), ("RLIMIT_MEMLOCK", 0),
                        ("RLIMIT_MSGQUEUE", 0), ("RLIMIT_NICE", 0), ("RLIMIT_RTPRIO", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))


def install_seccomp(filter_bytes):
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    prog = SockFprog(len(filter_bytes) // 8, filter_bytes)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def child(job, uid, fds):
    """pid 1 of the new namespace: build everything, drop everything, exec the program."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    # fds 0-4 as the program sees them, 5 = error (close-on-exec), 6 = lifeline; every source
    # is first copied above 100 so that no dup2 clobbers another source
    sources = [os.open("/dev/null", os.O_RDONLY), fds["output"], fds["output"], fds["input"], fds["results"],
               fds["error"], fds["lifeline"]]
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in sources]
    for target, fd in enumerate(high):
        os.dup2(fd, target, inheritable=target < 5)
    os.closerange(7, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    fds.update(error=5, lifeline=6)
    os.setsid()  # its own session and process group: kill(0, ...) reaches nothing of the launcher's
    build_root(job, uid)
    socket.sethostname("sandbox")
    set_limits(job["limits"])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # changing credentials cleared the parent-death signal: set it again, then make sure the
    # launcher did not die in between (its end of the lifeline closes when it exits)
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if select.select([fds["lifeline"]], [], [], 0)[0]:
        os._exit(1)
    os.close(fds["lifeline"])
    install_seccomp(bytes.fromhex(job["seccomp_hex"]))
    os.execve(job["python"], [job["python"], "-I", "-S", "-B", "/main.py"], {})


def supervise(pid, input_w, input_data, wall_s):
    """Feed the program's input and wait for it, killing it when the wall clock runs out."""
    pidfd = os.pidfd_open(pid)
    os.set_blocking(input_w, False)
    deadline = time.monotonic() + wall_s
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
            break
        watch = [pidfd] + ([input_w] if input_w is not None else [])
        readable, writable, _ = select.select([pidfd], watch[1:], [], left)
        if readable:
            break
        if writable:
            try:
                input_data = input_data[os.write(input_w, input_data[:65536]):]
            except BrokenPipeError:
                input_data = b""
            if not input_data:
                os.close(input_w)
                input_w = None
    if input_w is not None:
        os.close(input_w)
    _, status, usage = os.wait4(pid, 0)
    os.close(pidfd)
    return status, usage, timed_out


def main():
    job = json.loads(sys.stdin.read())
    uid = job["uid_base"] + os.getpid()  # unique among live sandboxes: process counts never mix
    fds = {"output": job["output_fd"], "results": job["results_fd"]}
    input_r, input_w = os.pipe()
    error_r, error_w = os.pipe()  # close-on-exec: empty at EOF means the exec happened
    lifeline_r, lifeline_w = os.pipe()
    fds.update(input=input_r, error=error_w, lifeline=lifeline_r)
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    pid = os.fork()
    if pid == 0:
        try:
            child(job, uid, fds)
        except BaseException as exc:  # report the setup failure, never run the program half-sandboxed
            os.write(fds["error"], f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(127)
    for fd in (input_r, error_w, lifeline_r, job["output_fd"], job["results_fd"]):
        os.close(fd)
    status, usage, timed_out = supervise(pid, input_w, job["input"].encode(), job["limits"]["wall_s"])
    setup_error = os.read(error_r, 4096).decode(errors="replace")
    report = {"exit_code": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "setup_error": setup_error,
              "cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_kb": usage.ru_maxrss}
    sys.stdout.write(json.dumps(report) + "\n")
    os.close(lifeline_w)


if __name__ == "__main__":
    main()
