"""What running an agent in an environment service costs per episode: the same episode of
examples/agents/calc_agent.py (two chat calls through the coordinator's rollout gateway) run
(A) by the service's episode runner inside this process, as agents ran before they moved to
environment services, and (B) by a `python -m reward_svc` process over RunEpisode (gRPC), as the
coordinator runs them now (coordinator/loop/gateway/agents.py). Interleaved A/B in one run, one
episode at a time. The gateway's generator is scripted (a fixed short reply, no model), so the
figures are the agent machinery's, not a model's.

    .venv/bin/python benchmarks/agent_env_overhead.py --episodes 200

Measured on the 2-core CPU machine under a load average of ~20 (2026-11-28), 200 episodes each:
in process median 75.2 ms (p99 240 ms), in the service median 73.9 ms (p99 289 ms): the RunEpisode
hop is within the noise of an episode's two gateway calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from coordinator.data.examples import Example
from coordinator.embedded.tiny_chat import build_chat_tokenizer
from coordinator.loop.gateway.agents import Environments, run_agents
from coordinator.loop.gateway.server import GatewayServer
from coordinator.loop.gateway.service import GatewayDefaults, RolloutGateway
from reward_svc.agents import EpisodeRunner
from reward_svc.client import RewardClient
from reward_svc.config import AgentSettings, RewardSettings
from tandem.generation.types import Completion

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "examples" / "agents"
TOKEN = "bench-token"


class Scripted:
    """A generator that answers every call with the same few tokens (and EOS)."""

    def __init__(self, tok):
        self.ids = (*tok("12", add_special_tokens=False)["input_ids"], tok.eos_token_id)

    def __call__(self, prompt, sampling):
        return [Completion(0, j, self.ids, tuple(-0.1 for _ in self.ids), "stop", 0) for j in range(sampling.n)]


class InProcess:
    def __init__(self, agents: dict[str, AgentSettings]):
        self.runner = EpisodeRunner(agents, structlog.get_logger())

    def run_episode(self, request, timeout_s):
        return asyncio.run(self.runner.run(request))


def start_service(root: Path, settings: RewardSettings) -> tuple[subprocess.Popen, str]:
    path, address_file = root / "env.json", root / "env.addr"
    path.write_text(settings.model_dump_json())
    env = {**os.environ, "TANDEM_TOKEN": TOKEN, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(AGENTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "reward_svc", "--settings", str(path), "--address-file",
                                str(address_file)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not address_file.is_file() or not address_file.read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the environment service did not start")
        time.sleep(0.1)
    return process, address_file.read_text().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, str(AGENTS))
    agent = AgentSettings(function="calc_agent.episode", timeout_s=30, max_concurrency=4)
    tok = build_chat_tokenizer()
    gateway = RolloutGateway(tok, Scripted(tok), GatewayDefaults(max_tokens=8, max_total_tokens=400))
    example = [Example("12+34=", "46", "agent", (1,))]
    with tempfile.TemporaryDirectory() as tmp, GatewayServer(gateway) as server:
        process, address = start_service(Path(tmp), RewardSettings(tasks={}, agents={"agent": agent}))
        local, remote = InProcess({"agent": agent}), RewardClient(address, TOKEN)
        kinds = {"in_process": local, "service": remote}
        times: dict[str, list[float]] = {k: [] for k in kinds}
        try:
            for i in range(args.episodes + 10):
                for name, client in kinds.items():
                    environments = Environments("agent", lambda c=client: [c], on_failure=lambda c, e: None,
                                                wait=time.sleep)
                    started = time.perf_counter()
                    (outcome,), = run_agents(gateway, server.url, "agent", agent, environments, example, 1)
                    elapsed = time.perf_counter() - started
                    assert outcome.reason is None and len(outcome.record.turns) == 2, outcome
                    if i >= 10:  # warm-up episodes left out
                        times[name].append(elapsed * 1000)
        finally:
            remote.close()
            local.runner.close()
            process.terminate()
            process.wait(30)
    report = {}
    for name, ms in times.items():
        ms.sort()
        report[name] = {"median_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2)}
    report["added_median_ms"] = round(report["service"]["median_ms"] - report["in_process"]["median_ms"], 2)
    print(json.dumps({"episodes": args.episodes, "calls_per_episode": 2, **report}, indent=1))


if __name__ == "__main__":
    main()
