"""In-flight weight updates (grpo.async_grpo.in_flight_weight_updates) on a real generator
(vLLM-CPU): a weight version pushed while long greedy completions run is applied at once, not
after them; the completions go on under the new weights and report the oldest version that
sampled any of their tokens.

With `recompute_kv_cache_after_weight_updates` the frozen requests' KV is recomputed under the
new weights, so each completion is exactly model A's greedy tokens up to some step and model
B's greedy continuation of that prefix from there (checked against Hugging Face). Without it
they keep A's KV for the tokens before the swap; the test checks the swap did not wait and the
versions reported. Seeded temperature-1 requests run through the swap too (a preempted seeded
request is recomputed: vLLM-CPU must not fail on it).

Last, the generator is killed alone (kill -9 of its pid, not of its process group, as the OOM
killer does) while it generates: vLLM's engine process, and everything else it started, exits by
itself (generator_svc/engines/parent_watch.py), where it used to run on for good.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest

from generator_svc.client import GeneratorClient
from tandem.generation.types import SamplingConfig
from tandem.rpc import RpcFailure
from tandem.weight_sync import WeightSender
from tests import procs
from tests.integration.test_generator_service import build_model, hf_greedy, prompts, push

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NEW_TOKENS = 448
NUM_PROMPTS = 48
MAX_NUM_SEQS = 3 * NUM_PROMPTS
"""Every request of the test (greedy n=1 and seeded n=2 per prompt) runs at once: one that waited
in vLLM's queue until after the push would be sampled by version 1 alone, and rightly say so."""


@pytest.fixture(scope="module", params=[True, False], ids=["recompute", "keep-kv"])
def generator(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("inflight")
    model_a, tokenizer = build_model(root / "A", seed=0)
    model_b, _ = build_model(root / "B", seed=1)
    settings = root / "generator.json"
    settings.write_text(json.dumps({
        "model_name": str(root / "A"), "max_model_len": 512, "max_num_seqs": MAX_NUM_SEQS, "seed": 0,
        "scratch_dir": str(root / "s"), "in_flight_weight_updates": True,
        "recompute_kv_cache_after_weight_updates": request.param}))
    service = procs.start(procs.python_module("generator_svc", "--settings", str(settings)), root, "generator",
                          timeout_s=300)
    client, sender = GeneratorClient(service.address, procs.TOKEN), WeightSender(secret=procs.TOKEN)
    yield {"client": client, "sender": sender, "A": model_a, "B": model_b, "tokenizer": tokenizer,
           "recompute": request.param, "service": service}
    sender.close()
    client.close()
    service.stop()


def _generate_while_pushing(g) -> tuple[list, list, float, float]:
    """Greedy and seeded completions started, B pushed as version 1 while they run; returns
    (greedy, seeded, when the push returned, when the completions were all back)."""
    batch = prompts(g["tokenizer"], NUM_PROMPTS)
    results: dict[str, list] = {}
    done: dict[str, float] = {}

    def run(name: str, sampling: SamplingConfig) -> None:
        results[name] = sorted(g["client"].generate(batch, sampling, request_id=name, timeout_s=300),
                               key=lambda c: (c.prompt_index, c.sample_index))
        done[name] = time.monotonic()

    threads = [threading.Thread(target=run, args=("greedy", SamplingConfig(n=1, temperature=0.0,
                                                                             max_tokens=NEW_TOKENS))),
               threading.Thread(target=run, args=("seeded", SamplingConfig(n=2, temperature=1.0,
                                                                             max_tokens=NEW_TOKENS, seed=5)))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the requests are running
    state = {k: v.detach().contiguous() for k, v in g["B"].state_dict().items()}
    assert push(g["client"], g["sender"], state, epoch=1, version=1) == 1
    pushed = time.monotonic()
    for thread in threads:
        thread.join(300)
    print(f"\npush returned after {pushed - started:.2f}s, completions after {max(done.values()) - started:.2f}s")
    return results["greedy"], results["seeded"], pushed, max(done.values())


def _switch_point(model_a, prompt: list[int], tokens: list[int]) -> int:
    """The first step at which `tokens` leave model A's greedy path."""
    expected, _ = hf_greedy(model_a, prompt, len(tokens))
    return next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), len(tokens))


def test_a_push_during_long_completions_applies_at_once(generator):
    g = generator
    greedy, seeded, pushed, finished = _generate_while_pushing(g)
    assert pushed < finished, "the push waited for the calls in flight"
    assert g["client"].info().weight_version == 1
    assert len(greedy) == NUM_PROMPTS and len(seeded) == 2 * NUM_PROMPTS
    for completion in [*greedy, *seeded]:
        assert completion.finish_reason in ("length", "stop")  # a random model may sample EOS
        assert completion.weight_version == 0  # sampled partly by version 0: the oldest is reported
    batch = prompts(g["tokenizer"], NUM_PROMPTS)
    switches = [_switch_point(g["A"], batch[c.prompt_index], list(c.token_ids)) for c in greedy[:6]]
    assert min(switches) < NEW_TOKENS, f"no completion left A's greedy path (switch points {switches})"
    if not g["recompute"]:
        return
    for completion, switch in zip(greedy[:6], switches):
        prompt, tokens = batch[completion.prompt_index], list(completion.token_ids)
        continuation, _ = hf_greedy(g["B"], prompt + tokens[:switch], len(tokens) - switch)
        assert tokens[switch:] == continuation, f"prompt {completion.prompt_index}: not B's greedy after step {switch}"
    fresh = sorted(g["client"].generate(batch[:2], SamplingConfig(n=1, temperature=0.0, max_tokens=8),
                                        timeout_s=120), key=lambda c: c.prompt_index)  # B from the first token
    assert all(c.weight_version == 1 for c in fresh)
    assert [list(c.token_ids) for c in fresh] == [hf_greedy(g["B"], p, 8)[0] for p in batch[:2]]


def test_killed_alone_mid_generation_its_engine_process_exits_too(generator):
    service = generator["service"]
    started_by_it = psutil.Process(service.process.pid).children(recursive=True)  # the engine, the log forwarder
    engines = [p for p in started_by_it if "EngineCore" in " ".join(p.cmdline())]
    assert len(engines) == 1, [p.cmdline() for p in started_by_it]
    outcome: list = []

    def generate() -> None:
        try:
            outcome.append(list(generator["client"].generate(prompts(generator["tokenizer"], NUM_PROMPTS),
                                                             SamplingConfig(n=1, temperature=0.0, max_tokens=NEW_TOKENS),
                                                             timeout_s=120)))
        except RpcFailure as exc:
            outcome.append(exc)

    long_call = threading.Thread(target=generate)
    long_call.start()
    time.sleep(0.5)
    os.kill(service.process.pid, signal.SIGKILL)
    killed = time.monotonic()
    gone, left = psutil.wait_procs(started_by_it, timeout=30)
    assert not left, f"still running 30 s after the generator was killed: {[(p.pid, p.name()) for p in left]}"
    print(f"\nthe generator's {len(gone)} processes exited {time.monotonic() - killed:.1f}s after its kill -9")
    long_call.join(60)
    assert outcome and isinstance(outcome[0], RpcFailure), "the kill did not land mid-generation"
