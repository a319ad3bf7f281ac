"""Colocated generation on one GPU (marked `gpu`: deselected by default, skipped without a CUDA
device; run with `pytest -m gpu`). The end-to-end GRPO loop of test_grpo_end_to_end in colocated
mode with the trainer (1 rank) and one vLLM generator sharing device 0: weights pass by CUDA IPC
handles, vLLM sleeps while the trainer trains. Checks that sleep frees device memory, that a
sleeping generator refuses work, and that after a publish the generator's logprobs match the
trainer's. A smaller test opens tandem.cuda_ipc handles in another process."""

import math
import multiprocessing

import pytest
import torch

from coordinator.algorithms.grpo import grpo_step
from coordinator.algorithms.sft import sft_steps
from coordinator.config import load_config
from tandem.colocation import WeightTransport
from tandem.cuda_ipc import device_uuid, export_handle, import_handle, pack_buckets, unpack_bucket
from tandem.generation.types import SamplingConfig
from tandem.rpc import RpcFailure, Status
from tandem.weight_sync import plan_for_state_dict
from trainer_svc.types import Sample

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GIB = 1 << 30


@pytest.fixture(scope="module")
def loop(tmp_path_factory, start_loop):
    root = tmp_path_factory.mktemp("e2e-gpu")
    cfg = load_config(overrides=[
        "cluster.num_generators=1", "cluster.trainer_ranks=1", f"logger.log_dir={root}",
        "logger.tensorboard_enabled=false", "policy.train_micro_batch_size=32",
        "policy.generation.colocated.enabled=true", "cluster.gpus_per_node=1"])  # placed: both on GPU 0
    with start_loop(root, cfg, num_train=2000, num_val=64) as (ctx, _):
        yield ctx


def _free_bytes() -> int:
    torch.cuda.synchronize(0)
    return torch.cuda.mem_get_info(0)[0]


def test_the_loop_resolves_to_cuda_ipc_with_sleep(loop):
    assert loop.services.trainer.info().device_type == "cuda"
    assert loop.phases.colocation.transport is WeightTransport.CUDA_IPC and loop.phases.colocation.sleeps


def test_sleep_frees_device_memory_and_refuses_work_until_woken(loop):
    loop.publish()
    generator = loop.services.all_generators()[0]
    awake = _free_bytes()
    loop.release_generators()
    asleep = _free_bytes()
    assert generator.client.info().sleeping == ("weights", "kv_cache")
    assert asleep - awake > GIB, f"sleep freed {(asleep - awake) / GIB:.2f} GiB"
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=4, seed=0)
    with pytest.raises(RpcFailure) as err:
        next(iter(generator.client.generate([loop.tokens.prompt("1+1=")], greedy, timeout_s=60)))
    assert err.value.status is Status.FAILED_PRECONDITION
    report = loop.publish()  # wake weights, CUDA IPC, wake KV cache
    assert report.epoch == -1 and report.bytes_sent > 0
    assert generator.client.info().sleeping == () and _free_bytes() < asleep - GIB


def test_sft_then_grpo_steps_complete_on_policy(loop):
    sft_losses = [sft_steps(loop, 10)["loss"] for _ in range(3)]
    assert sft_losses[-1] < sft_losses[0]
    loop.publish()
    for step in range(1, 4):
        metrics = grpo_step(loop, step)
        assert metrics["weight_version"] == loop.publisher.version
        assert metrics["generation_weight_version"] == loop.publisher.version - 1
        assert abs(metrics["token_mult_prob_error"] - 1.0) < 0.01, metrics
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    assert loop.phases.asleep == []


def test_after_a_publish_the_generator_logprobs_match_the_trainers(loop):
    loop.release_generators()
    loop.publish()
    prompt = loop.tokens.prompt("37+45=")
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=6, seed=0)
    for handle in loop.generators():
        assert handle.client.info().weight_version == loop.publisher.version
        completion = next(iter(handle.client.generate([prompt], greedy, request_id="check", timeout_s=60)))
        assert completion.weight_version == loop.publisher.version
        trainer_lps = loop.services.trainer.logprobs(
            [Sample(token_ids=prompt + list(completion.token_ids), prompt_length=len(prompt))], micro_batch_size=1)[0]
        assert len(trainer_lps) == len(completion.logprobs)
        assert max(abs(a - b) for a, b in zip(trainer_lps, completion.logprobs)) < 1e-3


def _read_in_child(payloads, plan, queue):
    received = {}
    for index, payload in enumerate(payloads):
        received.update(unpack_bucket(plan, index, import_handle(payload, plan.bucket_sizes_bytes[index])))
    queue.put({name: tensor.float().sum().item() for name, tensor in received.items()})


def test_cuda_ipc_handles_open_in_another_process():
    state = {"a.weight": torch.randn(64, 32), "b.bias": torch.randn(17)}
    plan = plan_for_state_dict(state, dtype=torch.bfloat16, bucket_bytes=2048)
    buffers = pack_buckets(plan, state.items(), torch.device("cuda", 0))  # alive until the child has read them
    payloads = [export_handle(b, device_uuid(0)) for b in buffers]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(payloads, plan, queue))
    child.start()
    sums = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    for name, tensor in state.items():
        assert sums[name] == pytest.approx(tensor.to(torch.bfloat16).float().sum().item(), rel=1e-3, abs=1e-3)
