"""generator_svc as a real process (vLLM on CPU): concurrent streaming generation, exact
logprobs against Hugging Face, an atomic weight push (and what failed pushes leave
serving), clear errors, auth, and a clean SIGTERM that leaves no vLLM process behind.

The tests share one generator process and run in file order: model A is served first,
then model B's weights are pushed, and the last test stops the process. This module's generator
has vLLM spawn its engine process (vLLM's own choice on CPU); every other test's forks it (the
default, `cpu_engine_start`).
"""

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch

from coordinator.embedded.tiny_model import TinyModelSpec, build_char_tokenizer, build_config
from generator_svc.client import GeneratorClient
from tandem.generation.types import SamplingConfig, ScoredSequence
from tandem.rpc import RpcFailure, Status, check_health
from tandem.weight_source import CollectiveSource
from tandem.weight_sync import GroupSpec, WeightSender, iter_plan_tensors, plan_for_state_dict
from tests import procs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MAX_MODEL_LEN = 2304  # long prompts: see test_seeded_long_prompts_that_share_a_step_are_sampled
SPEC = TinyModelSpec(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                     max_position_embeddings=MAX_MODEL_LEN)  # head_dim 32: vLLM's CPU attention has no kernel for 16
MAX_TOKENS = 8
SERVICE = "tandem.generator.v1.GeneratorService"
TIMINGS: dict[str, float] = {}


def build_model(out_dir, seed: int):
    """A tiny fp32 Llama with N(0, 0.15) weights (so greedy argmax is well separated), saved as HF."""
    from transformers import GenerationConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = build_config(SPEC, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                          tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")  # short: vLLM puts unix sockets under scratch_dir
    model_a, tokenizer = build_model(root / "A", seed=0)
    model_b, _ = build_model(root / "B", seed=1)
    settings = root / "generator.json"
    settings.write_text(json.dumps({"model_name": str(root / "A"), "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 64,
                                    "seed": 0, "scratch_dir": str(root / "s"), "cpu_engine_start": "spawn",
                                    "free_weights_while_training": True}))
    started = time.monotonic()
    service = procs.start(procs.python_module("generator_svc", "--settings", str(settings)), root, "generator",
                          timeout_s=300)
    TIMINGS["startup_s"] = time.monotonic() - started
    client = GeneratorClient(service.address, procs.TOKEN)
    sender = WeightSender(secret=procs.TOKEN)  # the generator seals its side with the run's token
    yield {"service": service, "client": client, "A": model_a, "B": model_b, "tokenizer": tokenizer,
           "root": root, "sender": sender}
    sender.close()
    client.close()
    service.stop()
    print("\ngenerator timings:", {k: round(v, 3) for k, v in TIMINGS.items()})


def prompts(tokenizer, count: int, length: int = 40) -> list[list[int]]:
    """Prompts of `length` tokens with BOS: longer than one 32-token KV block, so the prefix cache holds them."""
    texts = [f"{i * 37 % 1000}+{i * 11}=" * 8 for i in range(count)]
    return [tokenizer(t)["input_ids"][:length] for t in texts]


def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their (untempered) logprobs under a plain HF forward."""
    tokens, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([tokens])).logits[0, -1].double()
            lp = torch.log_softmax(logits, dim=-1)
            token = int(lp.argmax())
            tokens.append(token)
            logprobs.append(float(lp[token]))
    return tokens[len(prompt):], logprobs


def push(client, sender, state, epoch: int, version: int) -> int:
    """Publish `state` as `version`: the sender in a thread, the generator's receive in this one."""
    plan = plan_for_state_dict(state, torch.float32)
    group = GroupSpec(sender.address, epoch=epoch, epoch_secret=uuid.uuid4().hex, world_size=2, op_timeout_s=30.0)
    errors: list[BaseException] = []

    def send():
        try:
            sender.send(group, version, plan, iter_plan_tensors(plan, state))
        except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
            errors.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    try:
        return client.load_weights(CollectiveSource(group, 1, plan), version, timeout_s=120)
    finally:
        thread.join(60)
        assert not errors, errors


def check_matches_hf(client, model, batch, version: int) -> None:
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=MAX_TOKENS)
    completions = sorted(client.generate(batch, greedy, request_id="greedy", timeout_s=120),
                         key=lambda c: c.prompt_index)
    assert len(completions) == len(batch)
    for completion, prompt in zip(completions, batch):
        assert completion.weight_version == version
        expected_tokens, expected_lps = hf_greedy(model, prompt, len(completion.token_ids))
        assert list(completion.token_ids) == expected_tokens
        assert max(abs(a - b) for a, b in zip(completion.logprobs, expected_lps)) < 1e-4


def test_health_and_info_once_loaded(env):
    assert check_health(env["service"].address, SERVICE)
    info = env["client"].info()
    assert (info.weight_version, info.max_num_seqs, info.dtype) == (0, 64, "float32")
    assert info.engine.startswith("vllm")
    # the heap torch and vLLM left was frozen before the engine process started (the engine
    # process's start-up collections skip it: vllm_engine._freeze_heap)
    started = next(json.loads(line) for line in env["service"].log().splitlines() if '"engine_started"' in line)
    assert started["frozen_objects"] > 100_000, started


def test_concurrent_generate_calls_stream_every_sample(env):
    client, tokenizer = env["client"], env["tokenizer"]
    eos = tokenizer.eos_token_id
    batch = prompts(tokenizer, 3, length=12)

    def call(k: int):
        sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=MAX_TOKENS, seed=1000 * k)
        return list(client.generate(batch, sampling, request_id=f"call-{k}", timeout_s=120))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(4)))
    for completions in results:
        assert sorted((c.prompt_index, c.sample_index) for c in completions) == [
            (i, j) for i in range(3) for j in range(4)]
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) > 0 and c.weight_version == 0
            assert all(lp <= 0 for lp in c.logprobs)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == MAX_TOKENS and eos not in c.token_ids
    # the same seed gives the same samples; different sample indices give different ones
    assert sorted(results[1], key=lambda c: (c.prompt_index, c.sample_index)) == sorted(
        call(1), key=lambda c: (c.prompt_index, c.sample_index))
    assert len({c.token_ids for c in results[0]}) > 1


def test_a_seeded_sample_is_its_seed_whatever_the_grouping(env):
    """Sample j of prompt i in a seeded call (one vLLM request of n per prompt) is the sample a
    call of that prompt alone with n=1, seeded seed + i*n + j, gives: what a rollout's re-send of
    a dead generator's prompts relies on (coordinator/loop/rollout.py)."""
    client, batch = env["client"], prompts(env["tokenizer"], 3, length=12)
    grouped = {(c.prompt_index, c.sample_index): c.token_ids for c in client.generate(
        batch, SamplingConfig(n=4, temperature=1.0, max_tokens=MAX_TOKENS, seed=50), timeout_s=120)}
    for i, j in [(0, 0), (1, 3), (2, 1)]:
        [alone] = client.generate([batch[i]], SamplingConfig(n=1, temperature=1.0, max_tokens=MAX_TOKENS,
                                                             seed=50 + i * 4 + j), timeout_s=120)
        assert alone.token_ids == grouped[(i, j)], f"prompt {i} sample {j}"
    assert len(set(grouped.values())) > 1


def test_throughput_16_prompts_x_8_samples(env):
    batch = prompts(env["tokenizer"], 16)
    started = time.monotonic()
    completions = list(env["client"].generate(
        batch, SamplingConfig(n=8, temperature=1.0, max_tokens=MAX_TOKENS, seed=7), timeout_s=300))
    seconds = time.monotonic() - started
    assert len(completions) == 16 * 8
    TIMINGS["tokens_per_s_16x8x8"] = sum(len(c.token_ids) for c in completions) / seconds


def test_seeded_long_prompts_that_share_a_step_are_sampled(env):
    # 4 x 2000 prompt tokens do not fit one scheduler step (2304 tokens here). With chunked
    # prefill, vLLM would split one prompt over two steps and then rewind that seeded request's
    # CPU generator, which cannot rewind: the engine dies ("CPU Generator does not use offset").
    bos = env["tokenizer"].bos_token_id
    long_prompts = [[bos] + [5 + (k * (i + 1)) % 70 for k in range(1999)] for i in range(4)]
    completions = list(env["client"].generate(
        long_prompts, SamplingConfig(n=1, temperature=1.0, max_tokens=4, seed=3), timeout_s=120))
    assert sorted(c.prompt_index for c in completions) == [0, 1, 2, 3]
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in completions)


def test_score_tokens_gives_the_sampled_logprobs_and_top_k(env):
    """ScoreTokens (a distillation teacher's scoring: vLLM prompt_logprobs over the whole sequence)
    of sampled completions gives back the logprobs they were sampled with, and a full HF forward's;
    top_k lists each position's most likely tokens, most likely first."""
    client, model, batch = env["client"], env["A"], prompts(env["tokenizer"], 3, length=12)
    sampled = list(client.generate(batch, SamplingConfig(n=2, temperature=1.0, max_tokens=MAX_TOKENS, seed=11),
                                   timeout_s=120))
    sequences = [ScoredSequence(tuple(batch[c.prompt_index]) + c.token_ids, len(batch[c.prompt_index]))
                 for c in sampled]
    started = time.monotonic()
    scores = client.score(sequences, top_k=3, request_id="teacher", timeout_s=120)
    TIMINGS["score_6_sequences_s"] = time.monotonic() - started
    assert len(scores) == len(sampled)
    for c, seq, score in zip(sampled, sequences, scores):
        assert len(score.logprobs) == len(c.token_ids) == len(score.top)
        assert max(abs(a - b) for a, b in zip(score.logprobs, c.logprobs)) < 1e-4
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([seq.token_ids])).logits[0].double(), dim=-1)
        hf = [float(lp[seq.prompt_length - 1 + k, t]) for k, t in enumerate(c.token_ids)]
        assert max(abs(a - b) for a, b in zip(score.logprobs, hf)) < 1e-4
        for k, top in enumerate(score.top):
            assert len(top) == 3 and [lp_ for _, lp_ in top] == sorted((lp_ for _, lp_ in top), reverse=True)
            expected = torch.topk(lp[seq.prompt_length - 1 + k], 3)
            assert [t for t, _ in top] == expected.indices.tolist()
    assert all(not s.top for s in client.score(sequences[:2], timeout_s=120))  # top_k 0: none
    bos = env["tokenizer"].bos_token_id
    full = ScoredSequence((bos,) + tuple(5 + k % 70 for k in range(MAX_MODEL_LEN - 2)), MAX_MODEL_LEN - 5)
    [scored] = client.score([full], timeout_s=120)  # the longest sequence it scores: max_model_len - 1 tokens
    assert len(scored.logprobs) == 4 and all(lp <= 0 for lp in scored.logprobs)
    too_long = ScoredSequence(tuple(batch[0]) * 200, len(batch[0]))
    with pytest.raises(RpcFailure) as failure:
        client.score([too_long], timeout_s=60)
    assert failure.value.status is Status.INVALID_ARGUMENT and "max_model_len" in failure.value.details


def test_greedy_logprobs_match_hf_then_weight_push_swaps_to_b(env):
    client, batch = env["client"], prompts(env["tokenizer"], 4)
    check_matches_hf(client, env["A"], batch, version=0)  # also fills the prefix cache with A's KV

    state = {k: v.detach().contiguous() for k, v in env["B"].state_dict().items()}
    started = time.monotonic()
    version = push(client, env["sender"], state, epoch=1, version=1)
    TIMINGS["weight_receive_s"] = time.monotonic() - started
    assert version == 1
    assert client.info().weight_version == 1
    check_matches_hf(client, env["B"], batch, version=1)  # same prompts: A's cached KV must be gone


def _publish_tampered(client, sender, plan, state, *, epoch: int, tamper) -> pytest.ExceptionInfo:
    """Publish `state` as version 2 with `tamper(index, bucket)` run on each bucket after its
    checksum was taken; the generator's load must fail: its RpcFailure."""
    group = GroupSpec(sender.address, epoch=epoch, epoch_secret=uuid.uuid4().hex, world_size=2, op_timeout_s=30.0)
    sender.tamper = tamper
    thread = threading.Thread(target=lambda: _send_ignoring_errors(sender, group, 2, plan, state))
    thread.start()
    try:
        with pytest.raises(RpcFailure) as err:
            client.load_weights(CollectiveSource(group, 1, plan), 2, timeout_s=120)
    finally:
        thread.join(60)
        sender.tamper = None
    return err


def test_a_bucket_corrupted_in_flight_fails_the_publish_and_is_never_served(env):
    """A byte flipped in flight after the sender took its bucket's checksum: the generator refuses
    the version before applying anything (UNAVAILABLE, which the coordinator's publisher retries
    on a new epoch) and keeps serving the version it had, exactly."""
    client, sender = env["client"], env["sender"]
    state = {k: v.detach().clone().contiguous() for k, v in env["B"].state_dict().items()}
    plan = plan_for_state_dict(state, torch.float32)
    tampered: list[int] = []

    def flip(index: int, bucket: torch.Tensor) -> None:
        if index == 0:
            bucket[1000] ^= 0x10  # inside the first tensor's bytes
            tampered.append(index)

    err = _publish_tampered(client, sender, plan, state, epoch=10, tamper=flip)
    assert tampered == [0]
    assert err.value.status is Status.UNAVAILABLE and not err.value.status.rejects_request  # the publisher retries
    assert "bucket 0 of 1 of weight version 2" in err.value.details and "arrived corrupted" in err.value.details
    assert client.info().weight_version == 1 and check_health(env["service"].address, SERVICE)
    check_matches_hf(client, env["B"], prompts(env["tokenizer"], 2), version=1)  # B, untouched by the bad bytes

    # streamed (stream_weight_updates, the default): buckets are applied window by window as they
    # pass their checksums, so a bucket corrupted after the first window leaves weights of no
    # version, never served
    plan = plan_for_state_dict(state, torch.float32, bucket_bytes=64 << 10, checksum_window_bytes=128 << 10)
    later = plan.windows()[1].start  # the first bucket of the second window
    assert len(plan.windows()) > 2 and later > 1
    err = _publish_tampered(client, sender, plan, state, epoch=11,
                            tamper=lambda index, bucket: index == later and bucket.__setitem__(0, bucket[0] ^ 0x10))
    assert err.value.status is Status.UNAVAILABLE and f"bucket {later} of" in err.value.details
    assert "serves no version" in err.value.details
    assert not check_health(env["service"].address, SERVICE)
    with pytest.raises(RpcFailure) as err:
        list(client.generate([[1, 5]], SamplingConfig(n=1, temperature=0.0, max_tokens=2), timeout_s=30))
    assert err.value.status is Status.FAILED_PRECONDITION
    # the publisher's retry: the same version, sent whole, serves again
    assert push(client, sender, state, epoch=12, version=1) == 1
    assert check_health(env["service"].address, SERVICE)
    check_matches_hf(client, env["B"], prompts(env["tokenizer"], 2), version=1)


def _send_ignoring_errors(sender, group, version, plan, state) -> None:
    try:
        sender.send(group, version, plan, iter_plan_tensors(plan, state))
    except Exception:  # noqa: BLE001 - the receiver may leave the group before the sender is done
        pass


def test_failed_updates_keep_or_withdraw_the_served_version(env):
    client, sender, address = env["client"], env["sender"], env["service"].address
    state = {k: v.detach().contiguous() for k, v in env["B"].state_dict().items()}
    plan = plan_for_state_dict(state)
    # the trainer never sends: the transfer times out and version 1 keeps serving
    silent = GroupSpec(sender.address, epoch=2, epoch_secret=uuid.uuid4().hex, world_size=2, op_timeout_s=2.0)
    with pytest.raises(RpcFailure) as err:
        client.load_weights(CollectiveSource(silent, 1, plan), 2, timeout_s=60)
    assert err.value.status is Status.UNAVAILABLE
    assert client.info().weight_version == 1 and check_health(address, SERVICE)
    # every byte arrives but the model refuses a tensor half-way: weights of no known version
    with pytest.raises(RpcFailure):
        push(client, sender, {**state, "model.layers.0.bogus.weight": torch.zeros(3)}, epoch=3, version=2)
    assert not check_health(address, SERVICE)
    with pytest.raises(RpcFailure) as err:
        list(client.generate([[1, 5]], SamplingConfig(n=1, temperature=0.0, max_tokens=2), timeout_s=30))
    assert err.value.status is Status.FAILED_PRECONDITION
    # the next complete push brings it back
    assert push(client, sender, state, epoch=4, version=2) == 2
    assert check_health(address, SERVICE)
    check_matches_hf(client, env["B"], prompts(env["tokenizer"], 2), version=2)


def test_freed_weights_refuse_generation_until_a_complete_version_rebuilds_them(env):
    """CPU generators free their weights while the trainer trains (Sleep level 2,
    generator_svc/free_weights.py): generation is refused, a version that leaves a freed layer
    without tensors is not served, and a complete one serves exactly what HF computes."""
    client, sender, address = env["client"], env["sender"], env["service"].address
    state = {k: v.detach().contiguous() for k, v in env["B"].state_dict().items()}
    assert client.info().weight_version == 2
    assert client.sleep(2) == ()  # nothing asleep: the KV cache stays
    with pytest.raises(RpcFailure) as err:
        list(client.generate([[1, 5]], SamplingConfig(n=1, temperature=0.0, max_tokens=2), timeout_s=30))
    assert err.value.status is Status.FAILED_PRECONDITION and "freed" in err.value.details
    with pytest.raises(RpcFailure) as err:  # level 1 would offload to host memory: refused on CPU
        client.sleep(1)
    assert err.value.status is Status.FAILED_PRECONDITION
    holed = {k: v for k, v in state.items() if k != "model.layers.0.mlp.down_proj.weight"}
    with pytest.raises(RpcFailure) as err:
        push(client, sender, holed, epoch=5, version=3)
    assert "model.layers.0.mlp.down_proj" in err.value.details and not check_health(address, SERVICE)
    assert push(client, sender, state, epoch=6, version=3) == 3
    assert check_health(address, SERVICE)
    check_matches_hf(client, env["B"], prompts(env["tokenizer"], 2), version=3)


def test_requests_the_engine_cannot_run_are_invalid_arguments(env):
    client, sampling = env["client"], SamplingConfig(n=1, temperature=1.0, max_tokens=8)
    for bad_prompts, word in (([[1] * MAX_MODEL_LEN], "max_model_len"), ([[1, 5, 100000]], "prompt 0"),
                              ([[]], "empty")):
        with pytest.raises(RpcFailure) as err:
            list(client.generate(bad_prompts, sampling, timeout_s=30))
        assert err.value.status is Status.INVALID_ARGUMENT and word in err.value.details
    assert client.info().num_running == 0


def test_calls_without_the_token_are_refused(env):
    anonymous = GeneratorClient(env["service"].address, None)
    with pytest.raises(RpcFailure) as err:
        anonymous.info()
    assert err.value.status is Status.UNAUTHENTICATED
    with pytest.raises(RpcFailure) as err:
        list(anonymous.generate([[1, 5]], SamplingConfig(n=1, temperature=0.0, max_tokens=2), timeout_s=30))
    assert err.value.status is Status.UNAUTHENTICATED
    anonymous.close()


def test_sigterm_stops_cleanly_and_leaves_no_vllm_child(env):
    service = env["service"]
    children = psutil.Process(service.process.pid).children(recursive=True)
    assert len(children) >= 2  # EngineCore and its worker
    assert not procs.vllm_engine_forked(service)  # this module's settings ask vLLM to spawn it
    started = time.monotonic()
    service.process.terminate()
    assert service.process.wait(timeout=60) == 0, service.log()[-3000:]
    TIMINGS["stop_s"] = time.monotonic() - started
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.pid for p in alive]
    assert not (env["root"] / "s" / f"g{service.process.pid}").exists()  # its sockets and temp files
    stop = service.log().split('"service_stopping"', 1)[1]
    assert '"engine_closed"' in stop and "Traceback" not in stop and '"level": "error"' not in stop, stop
