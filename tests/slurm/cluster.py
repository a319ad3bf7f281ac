"""A real Slurm cluster on this machine, for tests: munged, slurmctld and N slurmd daemons
(Debian's slurm-wlm and munge), each Slurm daemon on a host of its own made of network and
UTS/mount namespaces (its own address on a bridge, hostname and /etc/hosts):

    10.79.0.1    login   slurmctld; the test's sbatch/squeue/scancel run here
    10.79.0.11   n1  }
    10.79.0.12   n2  }   slurmd: every job step runs here, in the node's namespaces
    ...              }

munged runs on the machine itself with a key and a socket of its own (Slurm talks to it over
that unix socket, named in slurm.conf); nothing listens outside the namespaces. Daemons run in
the foreground as children of the test and are stopped by pid; `stop` then reports every
process still inside the namespaces (a job step left behind) and kills it by pid.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

SUBNET = "10.79.0"
LOGIN = "login"


def slurm_conf(base: Path, nodes: dict[str, str], cpus: int, memory_mb: int) -> str:
    """slurm.conf for the controller on LOGIN and `nodes` (name -> address), everything under base."""
    lines = [
        "ClusterName=tandemtest", f"SlurmctldHost={LOGIN}({SUBNET}.1)",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={base / 'munge-run' / 'socket'}",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={base / 'state'}", f"SlurmdSpoolDir={base / 'spool' / '%n'}",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}", f"SlurmdPidFile={base / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={base / 'log' / 'slurmd-%n.log'}",
        # no cgroups and no systemd here: track steps by process tree, bind no tasks
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",  # the nodes' CPUs and memory as declared here, not as probed
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "ReturnToService=2", "KillWait=10", "SchedulerParameters=bf_interval=2",
    ]
    lines += [f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory_mb}" for name, addr in nodes.items()]
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class SlurmCluster:
    def __init__(self, num_nodes: int = 3, cpus: int = 4, memory_mb: int = 8000):
        self.prefix = f"tsl{secrets.token_hex(2)}"
        self.base = Path("/run") / f"tandem-slurm-{secrets.token_hex(3)}"  # the munge user must reach it
        self.nodes = {f"n{i}": f"{SUBNET}.{10 + i}" for i in range(1, num_nodes + 1)}
        self.hosts = {LOGIN: f"{SUBNET}.1", **self.nodes}
        self.cpus, self.memory_mb = cpus, memory_mb
        self.conf = self.base / "etc" / "slurm.conf"
        self.daemons: dict[str, subprocess.Popen] = {}
        self.namespaces: list[str] = []

    # ------------------------------------------------------------------ hosts
    def _make_hosts(self) -> None:
        switch = f"{self.prefix}-sw"
        _ip("netns", "add", switch)
        self.namespaces.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for number, (host, address) in enumerate(self.hosts.items()):
            ns = f"{self.prefix}-{host}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{number}", "netns", switch)
            _ip("-n", switch, "link", "set", f"p{number}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def on(self, host: str, argv: list[str]) -> list[str]:
        """argv run on `host`: its network namespace (nsenter keeps /sys, which slurmd reads), a
        hostname and /etc/hosts of its own."""
        inner = f'hostname {host} && mount --bind {self.base / "etc" / "hosts"} /etc/hosts && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{self.prefix}-{host}", "unshare", "--uts", "--mount",
                "--propagation", "private", "sh", "-c", inner, "sh", *argv]

    # ------------------------------------------------------------------ daemons
    def _daemon(self, name: str, argv: list[str]) -> None:
        with open(self.base / "log" / f"{name}.out", "wb") as out:
            self.daemons[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                  start_new_session=True)

    def _start_munge(self) -> None:
        keys, run = self.base / "munge", self.base / "munge-run"
        for path, mode in ((keys, 0o700), (run, 0o755)):  # munged checks both: private keys, reachable socket
            path.mkdir(mode=mode)
            shutil.chown(path, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "-c", "-k", str(keys / "key")], check=True,
                       capture_output=True, timeout=30)
        as_munge = ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups"]  # execs: its pid is munged's
        self._daemon("munged", [*as_munge, "munged", "-F", "-S", str(run / "socket"),
                                "--key-file", str(keys / "key"), "--pid-file", str(run / "pid"),
                                "--log-file", str(keys / "log"), "--seed-file", str(keys / "seed")])
        self._wait(lambda: (run / "socket").exists(), 20, "munged made no socket")

    def start(self) -> SlurmCluster:
        try:
            for sub in ("etc", "state", "spool", "log"):
                (self.base / sub).mkdir(parents=True, exist_ok=True)
            self.base.chmod(0o755)
            (self.base / "etc" / "hosts").write_text(
                "127.0.0.1 localhost\n" + "".join(f"{addr} {host}\n" for host, addr in self.hosts.items()))
            self.conf.write_text(slurm_conf(self.base, self.nodes, self.cpus, self.memory_mb))
            self._make_hosts()
            self._start_munge()
            self._daemon("slurmctld", self.on(LOGIN, ["slurmctld", "-D", "-f", str(self.conf)]))
            for node in self.nodes:
                self._daemon(f"slurmd-{node}", self.on(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)]))
            self._wait(self._all_idle, 60, "the nodes did not come up idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}: {self.daemon_log(name)[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} in {timeout_s:.0f}s:\n{self.logs_tail()}")
            time.sleep(0.5)

    def _all_idle(self) -> bool:
        result = self.login(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    # ------------------------------------------------------------------ commands
    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def login(self, argv: list[str], *, env: dict[str, str] | None = None, check: bool = True,
              timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Run argv on the login host (where a user submits)."""
        result = subprocess.run(self.on(LOGIN, argv), capture_output=True, text=True, timeout=timeout,
                                env={**self.env, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def jobs(self) -> list[str]:
        """Job ids the controller still knows as pending, running or completing."""
        return self.login(["squeue", "-h", "-o", "%i %T"], check=False).stdout.split("\n")[:-1]

    def daemon_log(self, name: str) -> str:
        path = self.base / "log" / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs_tail(self) -> str:
        parts = []
        for path in sorted((self.base / "log").glob("*")):
            parts.append(f"== {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ teardown
    def _namespace_processes(self) -> dict[int, str]:
        """Processes whose network namespace is one of ours (pid -> command line)."""
        inodes = set()
        for ns in self.namespaces:
            try:
                inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
            except FileNotFoundError:
                pass
        found = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.stat(entry / "ns" / "net").st_ino in inodes:
                        found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                except (FileNotFoundError, PermissionError, ProcessLookupError):
                    pass
        return found

    def stop(self) -> list[str]:
        """Cancel every job, stop the daemons by pid, remove the hosts and files; returns what had
        to be killed because it was still there (empty when the teardown was clean)."""
        leftovers: list[str] = []
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.login(["scancel", "--user=root"], check=False)
            deadline = time.monotonic() + 60
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(1)
            leftovers += [f"job {line}" for line in self.jobs()]
        for name in sorted(self.daemons, key=lambda n: ("munged" in n, "slurmctld" in n)):  # slurmd first
            proc = self.daemons[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    leftovers.append(f"daemon {name} ignored SIGTERM")
                    proc.kill()
                    proc.wait(timeout=10)
        for pid, cmd in self._namespace_processes().items():
            leftovers.append(f"process {pid}: {cmd}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)
        return leftovers
