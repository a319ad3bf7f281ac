"""trainer_svc under real torchrun (2 CPU ranks, gloo) driven through TrainerClient.

One trainer serves every test of this module; each test only relies on what it does itself
(tests that need the current weights export them first), so their order does not matter.
"""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.rpc import RpcFailure, Status
from tandem.weight_sync import GroupSpec
from tests import procs
from trainer_svc.client import TrainerClient
from trainer_svc.losses import dpo_loss, grpo_loss
from trainer_svc.types import BradleyTerryLossConfig, DpoLossConfig, GrpoLossConfig, NllLossConfig, Sample

pytestmark = pytest.mark.integration

VOCAB = 64
WORLD_SIZE = 2


def _build_tiny_llama(out_dir: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclasses.dataclass
class Trainer:
    service: procs.ServiceProcess
    client: TrainerClient
    model_dir: Path


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trainer")
    model_dir = _build_tiny_llama(workdir / "model")
    settings = workdir / "trainer.json"
    settings.write_text(json.dumps({"model_name": str(model_dir), "seed": 1, "optimizer": {"lr": 1e-3},
                                    "max_grad_norm": 1.0}))
    torchrun = Path(sys.executable).with_name("torchrun")
    service = procs.start([str(torchrun), "--standalone", "--nproc-per-node", str(WORLD_SIZE), "-m", "trainer_svc",
                           "--settings", str(settings)], workdir, "trainer")
    workers = _descendants(service.process.pid)
    client = TrainerClient(service.address, procs.TOKEN, long_call_timeout_s=120)
    yield Trainer(service, client, model_dir)
    client.close()
    workers += _descendants(service.process.pid)
    service.process.send_signal(signal.SIGTERM)  # torchrun forwards it; rank 0 releases the others
    try:
        rc = service.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    left = [pid for pid in workers if procs.alive(pid)]
    service.stop()
    assert rc is not None and not left, f"torchrun rc={rc}, processes left: {left}\n{service.log()[-3000:]}"
    assert "service_stopping" in service.log()


def _samples(seed: int, shapes=((9, 3), (6, 2), (12, 5), (7, 4), (10, 1))) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    return [Sample(tuple(torch.randint(3, VOCAB, (n,), generator=gen).tolist()), p) for n, p in shapes]


def _hf_model(model_dir: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _hf_logprobs(model, sample: Sample) -> torch.Tensor:
    """Completion-token logprobs by a plain unpadded HF forward (grad flows if enabled)."""
    ids = torch.tensor([list(sample.token_ids)])
    logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    return logp.gather(-1, ids[0, 1:, None])[:, 0][sample.prompt_length - 1:]


def _max_error(rows: list[list[float]], expected: list[torch.Tensor]) -> float:
    return max((torch.tensor(r) - e.detach()).abs().max().item() for r, e in zip(rows, expected, strict=True))


def test_info(trainer):
    info = trainer.client.info()
    hf = load_file(trainer.model_dir / "model.safetensors")
    assert (info.world_size, info.backend, info.device_type) == (WORLD_SIZE, "dtensor", "cpu")
    assert info.num_parameters == sum(t.numel() for t in hf.values())
    assert len(info.model_fingerprint) == 64 and info.weight_sync_store_address.startswith("127.0.0.1:")
    assert {t.name: t.shape for t in info.bucket_plan.tensors} == {n: tuple(t.shape) for n, t in hf.items()}


def test_logprobs_match_a_plain_hf_forward(trainer, tmp_path):
    samples = _samples(1)  # 5 samples over 2 ranks with micro-batches of 2: uneven shards
    assert trainer.client.export_hf(str(tmp_path / "now")) == 21
    with torch.no_grad():
        current = [_hf_logprobs(_hf_model(tmp_path / "now"), s) for s in samples]
        initial = [_hf_logprobs(_hf_model(trainer.model_dir), s) for s in samples]
    assert _max_error(trainer.client.logprobs(samples, "current", micro_batch_size=2), current) < 1e-5
    assert _max_error(trainer.client.logprobs(samples, "reference", micro_batch_size=3), initial) < 1e-5


def test_nll_steps_lower_the_loss(trainer):
    samples = _samples(2)[:4]
    losses = [trainer.client.train_step(samples, NllLossConfig(), global_batch_size=4, micro_batch_size=1,
                                        learning_rate=1e-2).metrics["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.05, losses


def test_on_policy_grpo_step(trainer):
    samples = _samples(3)[:4]
    logprobs = trainer.client.logprobs(samples, "current", micro_batch_size=4)
    batch = [dataclasses.replace(s, generation_logprobs=lp, advantage=a)
             for s, lp, a in zip(samples, logprobs, (1.0, -1.0, 0.5, -0.5))]
    result = trainer.client.train_step(batch, GrpoLossConfig(), global_batch_size=4, micro_batch_size=2)
    assert abs(result.metrics["token_mult_prob_error"] - 1.0) < 1e-4
    assert result.metrics["clip_fraction"] == 0.0
    assert abs(result.metrics["ratio_mean"] - 1.0) < 1e-5
    assert result.metrics["num_tokens"] == sum(s.completion_length for s in samples)


def test_two_ranks_match_one_process_computation(trainer, tmp_path):
    """The 2-rank, 4-micro-batch GRPO loss and grad norm equal one unsharded batch in this process."""
    config = GrpoLossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28, reference_policy_kl_penalty=0.1)
    samples = _samples(4)[:4]
    trainer.client.export_hf(str(tmp_path / "now"))
    model, reference = _hf_model(tmp_path / "now"), _hf_model(trainer.model_dir)
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():
        prev = [_hf_logprobs(model, s) for s in samples]
        ref = [_hf_logprobs(reference, s) for s in samples]
    gen = [p + 0.1 * torch.randn(p.shape, generator=noise) for p in prev]  # off-policy: weights != 1
    batch = [dataclasses.replace(s, generation_logprobs=g.tolist(), advantage=a)
             for s, g, a in zip(samples, gen, (1.0, -0.5, 0.25, -1.0))]

    curr = torch.cat([_hf_logprobs(model, s) for s in batch])[None]
    advantages = torch.cat([torch.full((s.completion_length,), s.advantage) for s in batch])[None]
    expected = grpo_loss(curr, prev_logprobs=torch.cat(prev)[None], generation_logprobs=torch.cat(gen)[None],
                         reference_logprobs=torch.cat(ref)[None], advantages=advantages,
                         mask=torch.ones_like(curr), num_global_tokens=curr.numel(), config=config)
    expected.loss.backward()
    grad_norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))

    result = trainer.client.train_step(batch, config, global_batch_size=4, micro_batch_size=1)
    assert result.metrics["loss"] == pytest.approx(expected.loss.item(), rel=1e-4, abs=1e-6)
    assert result.metrics["kl"] == pytest.approx(expected.metrics["kl"].item(), rel=1e-4, abs=1e-7)
    assert result.metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)


def test_two_ranks_dpo_matches_one_process_computation(trainer, tmp_path):
    """4 (chosen, rejected) pairs over 2 ranks in micro-batches of one pair: the DPO loss, its
    metrics and the grad norm equal the whole batch computed here against the initial weights."""
    config = DpoLossConfig(reference_policy_kl_penalty=0.5, sft_loss_weight=0.3)
    batch = _samples(11, shapes=((9, 3), (6, 2), (12, 5), (7, 4), (10, 1), (8, 2), (11, 6), (5, 1)))
    trainer.client.export_hf(str(tmp_path / "now"))
    model, reference = _hf_model(tmp_path / "now"), _hf_model(trainer.model_dir)
    curr = [_hf_logprobs(model, s) for s in batch]
    with torch.no_grad():
        ref = [_hf_logprobs(reference, s) for s in batch]
    width = max(len(c) for c in curr)

    def pad(rows):
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])

    expected = dpo_loss(pad(curr), reference_logprobs=pad(ref), mask=pad([torch.ones(len(c)) for c in curr]),
                        num_global_pairs=4, config=config)
    expected.loss.backward()
    grad_norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))

    result = trainer.client.train_step(batch, config, global_batch_size=8, micro_batch_size=2)
    for name in ("loss", "preference_loss", "sft_loss", "accuracy", "reward_margin"):
        assert result.metrics[name] == pytest.approx(expected.metrics[name].item(), rel=1e-4, abs=1e-6), name
    assert result.metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    with pytest.raises(RpcFailure) as err:  # a causal LM does not train with the reward-model loss
        trainer.client.train_step(batch, BradleyTerryLossConfig(), global_batch_size=8, micro_batch_size=2)
    assert err.value.status is Status.INVALID_ARGUMENT and "BradleyTerryLossConfig" in err.value.details
    with pytest.raises(RpcFailure) as err:  # a rank would split a pair
        trainer.client.train_step(batch[:6], config, global_batch_size=6, micro_batch_size=2)
    assert "whole pairs" in err.value.details


RECEIVER = """
import json, sys
from safetensors.torch import save_file
from tandem.weight_source import plan_from_dict
from tandem.weight_sync import GroupSpec, WeightReceiver
spec = json.load(open(sys.argv[1]))
plan = plan_from_dict(spec["plan"])  # its checksum windows included
receiver = WeightReceiver(secret=spec["token"])  # the trainer's store is sealed with the run's token
state = receiver.receive(GroupSpec(**spec["group"]), 1, spec["version"], plan)
receiver.close()
save_file({name: t.clone() for name, t in state.items()}, sys.argv[2])  # staged tensors are views of their bucket
"""


def test_publish_weights_equal_the_exported_checkpoint(trainer, tmp_path):
    info = trainer.client.info()
    group = GroupSpec(info.weight_sync_store_address, epoch=1, epoch_secret="s3cret", world_size=2, op_timeout_s=60)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"plan": dataclasses.asdict(info.bucket_plan), "group": dataclasses.asdict(group),
                                "version": 3, "token": procs.TOKEN}))
    script = tmp_path / "receiver.py"
    script.write_text(RECEIVER)
    # the code under test, not whatever checkout the environment's install of the package points at
    root = str(Path(__file__).resolve().parents[2])
    receiver = subprocess.Popen([sys.executable, str(script), str(spec), str(tmp_path / "received.safetensors")],
                                env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root})
    try:
        published = trainer.client.publish_weights(group, version=3)
        assert receiver.wait(timeout=60) == 0
    finally:
        if receiver.poll() is None:
            receiver.kill()
    assert published.bytes_sent == info.bucket_plan.total_bytes
    trainer.client.export_hf(str(tmp_path / "export"))
    received = load_file(tmp_path / "received.safetensors")
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert received.keys() == exported.keys()
    assert all(torch.equal(received[name], exported[name]) for name in exported)


def test_publish_to_an_absent_receiver_times_out_and_the_trainer_goes_on(trainer):
    info = trainer.client.info()
    group = GroupSpec(info.weight_sync_store_address, epoch=99, epoch_secret="nobody", world_size=2, op_timeout_s=2)
    with pytest.raises(RpcFailure) as err:
        trainer.client.publish_weights(group, version=4)
    assert err.value.status is Status.UNAVAILABLE
    assert len(trainer.client.logprobs(_samples(8), "current", micro_batch_size=2)) == 5  # ranks still in step


def test_checkpoint_round_trip(trainer, tmp_path):
    samples = _samples(6)[:4]
    logprobs = trainer.client.logprobs(samples, "current", micro_batch_size=4)
    batch = [dataclasses.replace(s, generation_logprobs=[x - 0.05 for x in lp], advantage=a)
             for s, lp, a in zip(samples, logprobs, (1.0, -1.0, 0.5, -0.5))] * 2  # 2 optimizer steps: Adam state counts
    step = trainer.client.info().global_step
    trainer.client.save_checkpoint(str(tmp_path / "ckpt"), background=True)  # both ranks write their shards
    first = trainer.client.train_step(batch, GrpoLossConfig(), global_batch_size=4, micro_batch_size=2)
    assert trainer.client.checkpoint_written(str(tmp_path / "ckpt"), timeout_s=60)
    assert sorted(p.name for p in (tmp_path / "ckpt" / "written").iterdir()) == ["rank0", "rank1"]
    assert trainer.client.load_checkpoint(str(tmp_path / "ckpt")) == step  # the state before that step
    again = trainer.client.train_step(batch, GrpoLossConfig(), global_batch_size=4, micro_batch_size=2)
    assert again.global_step == first.global_step == step + 2
    assert again.metrics == pytest.approx(first.metrics, rel=1e-6, abs=1e-7)
    with pytest.raises(RpcFailure) as err:
        trainer.client.load_checkpoint(str(tmp_path / "missing"))
    assert err.value.status is Status.INVALID_ARGUMENT


class StalledDisk:
    """The trainer's client, with a checkpoint's shard file made a FIFO first: the trainer's
    background write blocks on it (a disk that does not finish) until the test is done."""

    def __init__(self, client: TrainerClient):
        self.client = client

    def save_checkpoint(self, path: str, *, background: bool = False) -> int:
        (Path(path) / "dcp").mkdir(parents=True)
        os.mkfifo(Path(path) / "dcp" / "__0_0.distcp")
        return self.client.save_checkpoint(path, background=background)

    def checkpoint_written(self, path: str, timeout_s: float) -> bool:
        return self.client.checkpoint_written(path, timeout_s)


def test_a_trainer_killed_mid_write_leaves_the_previous_checkpoint_to_resume(trainer, tmp_path):
    """A one-rank trainer checkpoints at step 1 (complete), trains, starts the step-2 checkpoint
    and is killed while writing it: the run resumes from step 1's, which loads into the
    two-rank trainer (resharded)."""
    from coordinator.checkpoint import resume, store

    settings = tmp_path / "trainer.json"
    settings.write_text(json.dumps({"model_name": str(trainer.model_dir), "seed": 1, "optimizer": {"lr": 1e-3}}))
    torchrun = Path(sys.executable).with_name("torchrun")
    one = procs.start([str(torchrun), "--standalone", "--nproc-per-node", "1", "-m", "trainer_svc",
                       "--settings", str(settings)], tmp_path, "one-rank-trainer")
    client = TrainerClient(one.address, procs.TOKEN, long_call_timeout_s=120)
    try:
        batch = _samples(6)[:4]
        log = procs.Events()
        writer = store.CheckpointWriter(tmp_path / "checkpoints", keep=2, log=log, write_limit_s=60)
        client.train_step(batch, NllLossConfig(), global_batch_size=4, micro_batch_size=2)
        writer.save(1, {"step": 1, "weight_version": 1, "cursor": {}}, client)
        writer.wait()
        client.train_step(batch, NllLossConfig(), global_batch_size=4, micro_batch_size=2)
        writer.save(2, {"step": 2, "weight_version": 2, "cursor": {}}, StalledDisk(client))  # returns: written later
        assert not client.checkpoint_written(str(tmp_path / "checkpoints" / ".tmp_step_000002" / "trainer"), 0.5)
        for pid in [*_descendants(one.process.pid), one.process.pid]:  # the rank (it serves the calls) first
            os.kill(pid, signal.SIGKILL)
        assert isinstance(writer.settle(), store.CheckpointWriteFailed)
        assert log.names.count("checkpoint_saved") == 1 and "checkpoint_failed" in log.names
    finally:
        client.close()
        one.stop()
    path, state = resume.find(tmp_path / "checkpoints")
    assert path.name == "step_000001" and state.step == 1
    assert trainer.client.load_checkpoint(str(path / "trainer")) == 1


def test_bad_batch_and_missing_token_are_refused(trainer):
    with pytest.raises(RpcFailure) as err:
        trainer.client.train_step(_samples(7)[:3], NllLossConfig(), global_batch_size=2, micro_batch_size=1)
    assert err.value.status is Status.INVALID_ARGUMENT
    anonymous = TrainerClient(trainer.service.address, None)
    with pytest.raises(RpcFailure) as err:
        anonymous.info()
    assert err.value.status is Status.UNAUTHENTICATED
    anonymous.close()
    assert trainer.client.info().world_size == WORLD_SIZE  # still serving after refusals
