"""Tandem across hosts, on one machine: each "host" is a network namespace the test makes
(its own interface and private address, a veth into a bridge that lives in a namespace of its
own, its own hostname and /etc/hosts), and the services are started there the way they would
be on separate machines (coordinator/cli/container.py, joining the coordinator by address):

    10.77.0.1  coordinator (launch: external) and the reward service
    10.77.0.2  trainer node A  } one torchrun job over a c10d rendezvous at 10.77.0.2:29400,
    10.77.0.3  trainer node B  } one rank on each node
    10.77.0.4  generator

The run must finish its GRPO steps. Namespaces and processes are removed at the end, even on
failure. Needs root (ip netns, unshare).
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import procs

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
HOSTS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4}
SHORT_JOB = ["sft.max_num_steps=20", "sft.val_period=20", "grpo.max_num_steps=2", "grpo.num_prompts_per_step=8",
             "grpo.num_generations_per_prompt=4", "grpo.max_val_samples=16", "grpo.val_period=0",
             "policy.train_global_batch_size=32", "policy.train_micro_batch_size=32", "data.num_train=500",
             "data.num_val=16", "checkpointing.enabled=false", "logger.tensorboard_enabled=false",
             "logger.plot_enabled=false", "logger.run_name=multihost", "cluster.num_generators=1"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def hosts(tmp_path):
    """Namespaces <prefix>-h1..h4 wired to a bridge in <prefix>-sw; yields (prefix, hosts file)."""
    prefix = f"tdm{secrets.token_hex(2)}"
    made: list[str] = []
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{n} {h}\n" for h, n in HOSTS.items()))
    try:
        switch = f"{prefix}-sw"
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host, number in HOSTS.items():
            ns = f"{prefix}-{host}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{number}", "netns", switch)
            _ip("-n", switch, "link", "set", f"p{number}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{number}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield prefix, hosts_file
    finally:
        for ns in reversed(made):  # deleting a namespace removes its veth ends and the bridge
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        assert prefix not in left, f"namespaces left behind: {left}"


class Fleet:
    """Processes started inside the namespaces, each in its own session; stopped by group id."""

    def __init__(self, prefix: str, hosts_file: Path, log_dir: Path, env: dict[str, str]):
        self.prefix, self.hosts_file, self.log_dir, self.env = prefix, hosts_file, log_dir, env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, host: str, *args: str) -> subprocess.Popen:
        # a hostname and /etc/hosts of its own, so gloo and torchrun find this host's address
        inner = (f"hostname {host} && mount --bind {self.hosts_file} /etc/hosts && "
                 f"exec {sys.executable} -m coordinator.cli.container {' '.join(args)}")
        argv = ["ip", "netns", "exec", f"{self.prefix}-{host}", "unshare", "--uts", "--mount", "--propagation",
                "private", "sh", "-c", inner]
        with open(self.log_dir / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


def test_coordinator_trainer_nodes_and_generator_on_separate_hosts(hosts, tmp_path):
    prefix, hosts_file = hosts
    env = {**os.environ, "TANDEM_TOKEN": procs.TOKEN, "TANDEM_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1",
           "TANDEM_OVERRIDES": " ".join([*SHORT_JOB, f"logger.log_dir={tmp_path / 'runs'}"])}
    fleet = Fleet(prefix, hosts_file, tmp_path, env)
    coordinator = f"{SUBNET}.1:50051"
    trainer_node = ["trainer", "--coordinator", coordinator, "--ranks", "1", "--nnodes", "2",
                    "--rdzv-endpoint", f"{SUBNET}.2:29400", "--rdzv-id", prefix]
    try:
        run = fleet.start("coordinator", "h1", "coordinator", "--port", "50051")
        fleet.start("reward", "h1", "reward", "--task", "arithmetic", "--coordinator", coordinator, "--port", "50052")
        fleet.start("trainer-a", "h2", *trainer_node, "--node-rank", "0")
        fleet.start("trainer-b", "h3", *trainer_node, "--node-rank", "1")
        fleet.start("generator", "h4", "generator", "--coordinator", coordinator)
        try:
            code = run.wait(timeout=1200)
        except subprocess.TimeoutExpired:
            code = None
        logs = {name: fleet.log(name)[-2500:] for name in fleet.procs}
        assert code == 0, "\n\n".join(f"== {name}\n{text}" for name, text in logs.items())
    finally:
        fleet.stop_all()
    run_dir = tmp_path / "runs" / "multihost"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == 2 and summary["accuracy_after"] is not None
    joined = [json.loads(line) for line in (run_dir / "logs" / "coordinator.log").read_text().splitlines()
              if '"member_joined"' in line]
    hosts_of = {m["kind"]: m["address"].split(":")[0] for m in joined}
    assert hosts_of == {"trainer": hosts_of["trainer"], "generator": f"{SUBNET}.4", "reward": f"{SUBNET}.1"}
    assert hosts_of["trainer"] in (f"{SUBNET}.2", f"{SUBNET}.3")  # rank 0 is whichever node the rendezvous made it
    ranks = [_ranks(fleet.log(name)) for name in ("trainer-a", "trainer-b")]
    assert sorted(ranks, key=sorted) == [{0}, {1}], ranks  # one rank of the trainer's job on each node


def _ranks(log: str) -> set[int]:
    """The torch ranks that logged in a node's output (structured lines carry `rank`)."""
    found = set()
    for line in log.splitlines():
        if line.startswith("{") and '"rank"' in line:
            found.add(json.loads(line)["rank"])
    return found
