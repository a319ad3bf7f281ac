"""The seccomp filter installed on every sandboxed program, as raw classic-BPF bytes.

The namespaces and the unprivileged uid already deny what these syscalls would do outside
the sandbox; the filter removes kernel attack surface a program never needs (creating user
namespaces, mounting, tracing, keyrings, eBPF, io_uring, perf...), refuses every socket
family except AF_UNIX (a second wall behind the empty network namespace), and kills the
process on any foreign syscall ABI (i386 `int 0x80`, x32) whose numbers would bypass the list.

The bytes are built here, in the service, and handed to the launcher, which installs them
with PR_SET_NO_NEW_PRIVS + PR_SET_SECCOMP just before it execs the program.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (args[0]'s low word at 16, little endian)
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_X32_BIT = 0x40000000
_AF_UNIX = 1
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

# Syscalls refused with EPERM. Numbers per architecture (x86_64: arch/x86/entry/syscalls/syscall_64.tbl;
# aarch64: include/uapi/asm-generic/unistd.h).
_DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "ptrace", "process_vm_readv",
           "process_vm_writev", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "init_module", "finit_module",
           "delete_module", "open_by_handle_at", "name_to_handle_at", "fanotify_init", "pidfd_getfd", "open_tree",
           "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "swapon", "swapoff", "reboot",
           "acct", "syslog", "personality")
_TABLES = {
    "x86_64": dict(
        audit_arch=0xC000003E, clone=56, clone3=435, socket=41,
        unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161, ptrace=101,
        process_vm_readv=310, process_vm_writev=311, keyctl=250, add_key=248, request_key=249, bpf=321,
        perf_event_open=298, userfaultfd=323, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
        kexec_load=246, init_module=175, finit_module=313, delete_module=176, open_by_handle_at=304,
        name_to_handle_at=303, fanotify_init=300, pidfd_getfd=438, open_tree=428, move_mount=429, fsopen=430,
        fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, swapon=167, swapoff=168, reboot=169, acct=163,
        syslog=103, personality=135),
    "aarch64": dict(
        audit_arch=0xC00000B7, clone=220, clone3=435, socket=198,
        unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, ptrace=117,
        process_vm_readv=270, process_vm_writev=271, keyctl=219, add_key=217, request_key=218, bpf=280,
        perf_event_open=241, userfaultfd=282, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
        kexec_load=104, init_module=105, finit_module=273, delete_module=106, open_by_handle_at=265,
        name_to_handle_at=264, fanotify_init=262, pidfd_getfd=438, open_tree=428, move_mount=429, fsopen=430,
        fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, swapon=224, swapoff=225, reboot=142, acct=89,
        syslog=116, personality=92),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter program for this machine's architecture (struct sock_filter[], 8 bytes each).

    Raises RuntimeError on an architecture without a syscall table: the sandbox then refuses
    to run rather than run unfiltered.
    """
    machine = machine or platform.machine()
    table = _TABLES.get(machine)
    if table is None:
        raise RuntimeError(f"no seccomp syscall table for {machine!r}; the code sandbox supports {sorted(_TABLES)}")
    eperm, enosys, eafnosupport = (_ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS, _ERRNO | errno.EAFNOSUPPORT)
    prog = [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ_K, table["audit_arch"], jt=1), _insn(_RET_K, _KILL_PROCESS),
            _insn(_LD_W_ABS, _NR)]
    if machine == "x86_64":  # x32 ABI numbers carry bit 30; they would dodge the list below
        prog += [_insn(_JGE_K, _X32_BIT, jf=1), _insn(_RET_K, _KILL_PROCESS)]
    for name in _DENIED:
        prog += [_insn(_JEQ_K, table[name], jf=1), _insn(_RET_K, eperm)]
    # clone3 passes its flags in memory BPF cannot read: ENOSYS makes glibc fall back to clone
    prog += [_insn(_JEQ_K, table["clone3"], jf=1), _insn(_RET_K, enosys)]
    # clone: threads and fork are fine; any CLONE_NEW* namespace flag is not
    prog += [_insn(_JEQ_K, table["clone"], jf=4), _insn(_LD_W_ABS, _ARG0), _insn(_JSET_K, _CLONE_NEW_ANY, jf=1),
             _insn(_RET_K, eperm), _insn(_RET_K, _ALLOW)]
    # socket: AF_UNIX only
    prog += [_insn(_JEQ_K, table["socket"], jf=4), _insn(_LD_W_ABS, _ARG0), _insn(_JEQ_K, _AF_UNIX, jf=1),
             _insn(_RET_K, _ALLOW), _insn(_RET_K, eafnosupport)]
    prog.append(_insn(_RET_K, _ALLOW))
    return b"".join(prog)
