"""Run untrusted Python in a sandbox, one fresh process tree per program.

Layers (each is enough on its own for the threat it names; together they overlap):
- namespaces (launcher.py): its own mount, network, pid, ipc and uts namespaces. The network
  namespace has only a downed loopback: no connection leaves, not even to 127.0.0.1. The pid
  namespace shows the program only its own processes, and all of them die with its init.
- file tree (launcher.py): pivot_root into a read-only tmpfs holding only /usr, the lib dirs,
  the interpreter's prefix and /etc/ld.so.cache (read-only binds), a private /proc, a /dev with
  null/zero/random/urandom, and /tmp: a size- and inode-limited tmpfs, the working dir, gone
  when the run ends. The service's files, its token and /dev/shm are not in the tree.
- identity: an unprivileged uid of its own per run (no capabilities), no groups,
  no_new_privs, an empty environment (nothing of the service's, TANDEM_TOKEN included).
- rlimits: CPU time, address space, processes (per-run uid), file size, open files, no core
  dumps, no locked memory.
- seccomp (seccomp.py): no namespace/mount/ptrace/keyring/eBPF/io_uring/perf syscalls, no
  socket family but AF_UNIX, no foreign syscall ABI.
- supervision (launcher.py, runner.py): a wall clock that kills the pid namespace, a second
  deadline that kills the launcher (which takes the namespace with it), output read with a cap.

Needs root (CAP_SYS_ADMIN and CAP_SETUID) in the service; without it every run fails with a
`setup_error` and never runs the program unsandboxed.
"""

from reward_svc.sandbox.runner import SandboxResult, run_program

__all__ = ["SandboxResult", "run_program"]
