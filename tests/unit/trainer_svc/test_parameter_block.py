"""A one-rank trainer that trains in the generators' dtype keeps the parameters a publish carries in
one block laid out as the bucket plan (trainer_svc/publish.py): every bucket goes out from that
memory, no copy, in a few large buckets. The block must stay the parameters' memory through
training (with a reference pass, which swaps values in and out), a checkpoint round trip and an HF
export; a trainer that publishes in another dtype keeps its parameters as they were."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from tandem.weight_sync import iter_buckets, make_bucket_plan
from tests.buckets import unpack
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.config import TrainerSettings
from trainer_svc.hf import write_hf_checkpoint
from trainer_svc.publish import weight_sync_plan
from trainer_svc.types import GrpoLossConfig, Sample

SAMPLES = [Sample([1, 10 + i, 12, 5, 20 + i, 30, 7 + i], 4, generation_logprobs=[-3.0, -3.1, -2.9],
                  advantage=(-1.0) ** i * (1 + 0.1 * i)) for i in range(8)]
LOSS = GrpoLossConfig(reference_policy_kl_penalty=0.05)  # a reference pass: values swapped in and out


def _settings(served: str) -> TrainerSettings:
    return TrainerSettings(model_name=str(ensure_tiny_model(cache_root())), seed=0, dtype="float32",
                           weight_sync_dtype=served)


def _storages(backend) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in backend._params}


def _no_packing(index, size):
    raise AssertionError(f"bucket {index} was packed: every bucket should go from the parameters' block")


@pytest.fixture
def trainer(world_of_one):
    made = DTensorBackend(_settings("float32"), world_of_one)
    yield made
    made.close()


def test_the_published_parameters_live_in_one_block_that_every_bucket_goes_from(trainer, world_of_one, tmp_path):
    loaded = {name: t.clone() for name, t in trainer.iter_hf_tensors()}
    assert len(_storages(trainer)) == len(trainer._params)
    plan = weight_sync_plan(_settings("float32"), trainer)

    assert plan.in_block and len(_storages(trainer)) == 1  # every parameter is a view of the block
    assert len(plan.bucket_sizes_bytes) < len(plan.tensors)  # several tensors a bucket
    assert unpack(plan, trainer.iter_published_tensors()).keys() == loaded.keys()
    assert all(torch.equal(got, loaded[n]) for n, got in unpack(plan, trainer.iter_published_tensors()).items())
    (block,) = _storages(trainer)
    sent = dict(iter_buckets(plan, trainer.iter_published_tensors(), _no_packing, in_place_device=torch.device("cpu")))
    assert all(b.untyped_storage().data_ptr() == block for b in sent.values())

    trainer.train_step(SAMPLES, LOSS, 8, 4, 1e-3)  # the optimizer updates the block in place
    assert _storages(trainer) == {block}
    trained = {name: t.clone() for name, t in trainer.iter_hf_tensors()}
    assert any(not torch.equal(trained[n], loaded[n]) for n in loaded)
    sent = dict(iter_buckets(plan, trainer.iter_published_tensors(), _no_packing, in_place_device=torch.device("cpu")))
    got = {s.name: sent[s.bucket_index][s.offset_bytes:s.offset_bytes + s.size_bytes].view(torch.float32).view(s.shape)
           for s in plan.tensors}
    assert all(torch.equal(got[n], trained[n]) for n in trained)

    # an HF export of the block's views, and a checkpoint round trip into another block
    write_hf_checkpoint(trainer.gather_hf_state_dict(), tmp_path / "hf", source_dir=trainer._model_name,
                        dtype=torch.float32)
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert all(torch.equal(exported[n], trained[n]) for n in trained)
    trainer.save_checkpoint(tmp_path / "ckpt")
    fresh = DTensorBackend(_settings("float32"), world_of_one)
    try:
        weight_sync_plan(_settings("float32"), fresh)
        assert len(_storages(fresh)) == 1
        assert fresh.load_checkpoint(tmp_path / "ckpt") == 1
        assert all(torch.equal(t, trained[n]) for n, t in fresh.iter_hf_tensors())
        again = trainer.train_step(SAMPLES, LOSS, 8, 4, 1e-3)
        assert fresh.train_step(SAMPLES, LOSS, 8, 4, 1e-3).metrics["loss"] == again.metrics["loss"]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(trainer.iter_hf_tensors(), fresh.iter_hf_tensors()))
    finally:
        fresh.close()


def test_a_trainer_that_publishes_in_another_dtype_keeps_its_parameters_where_they_are(world_of_one):
    trainer = DTensorBackend(_settings("bfloat16"), world_of_one)
    try:
        plan = weight_sync_plan(_settings("bfloat16"), trainer)
        assert len(_storages(trainer)) == len(trainer._params)
        assert {s.dtype for s in plan.tensors} == {"bfloat16"}
        settings = _settings("bfloat16")
        shapes = [(n, s, torch.bfloat16) for n, s in trainer.published_tensor_shapes.items()]
        assert plan == make_bucket_plan(shapes, settings.weight_sync_bucket_bytes, settings.weight_sync_in_place_bytes,
                                        settings.weight_sync_checksum_window_bytes)  # the plan as before blocks
    finally:
        trainer.close()
