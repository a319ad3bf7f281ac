"""Colocated publishing: the trainer writes each version into shared memory, every generator
loads it from there, the directory is removed, and a failed load is retried (in-process fakes)."""

from pathlib import Path

import pytest
import structlog

from coordinator.loop.weights.publisher import PublishError, WeightPublisher
from coordinator.loop.weights.transports import SharedMemoryTransport, shared_memory_dir
from coordinator.membership.services import GeneratorHandle
from tandem.rpc import RpcFailure, Status
from tandem.weight_source import SharedMemorySource


def Unavailable() -> RpcFailure:
    return RpcFailure(Status.UNAVAILABLE, "load failed")


class FakeTrainer:
    def __init__(self):
        self.exports: list[Path] = []

    def export_hf(self, path: str, for_generators: bool = False) -> int:
        assert for_generators, "a version for the generators: in the dtype they serve"
        out = Path(path)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"x" * 100)
        self.exports.append(out)
        return 1

    def info(self):
        return type("Info", (), {"global_step": 0})()


class FakeGenerator:
    def __init__(self, failures: int = 0):
        self.failures, self.version, self.seen = failures, 0, []

    def info(self, timeout_s=0):
        return self

    def load_weights(self, source, version: int, timeout_s: float = 0) -> int:
        assert isinstance(source, SharedMemorySource), "colocated on CPU: no weight-sync group"
        self.seen.append(sorted(p.name for p in Path(source.directory).iterdir()))
        if self.failures:
            self.failures -= 1
            raise Unavailable()
        self.version = version
        return version


def _publisher(tmp_path, trainer):
    log = structlog.get_logger()
    return WeightPublisher(trainer, SharedMemoryTransport(trainer, tmp_path, log, op_timeout_s=1.0), log)


def test_every_generator_loads_the_version_from_shared_memory(tmp_path):
    trainer, gens = FakeTrainer(), [FakeGenerator(), FakeGenerator()]
    handles = [GeneratorHandle(f"g{i}", g, 4) for i, g in enumerate(gens)]
    publisher = _publisher(tmp_path, trainer)
    report = publisher.publish(handles)
    assert (report.version, report.epoch, report.bytes_sent, report.num_generators) == (1, -1, 100, 2)
    assert [g.version for g in gens] == [1, 1] and all(g.seen == [["model.safetensors"]] for g in gens)
    assert not trainer.exports[0].exists() and list(tmp_path.iterdir()) == []  # removed after the publish
    publisher.publish(handles)
    assert [g.version for g in gens] == [2, 2] and trainer.exports[1] != trainer.exports[0]


def test_a_failed_load_is_retried_then_reported(tmp_path):
    flaky = FakeGenerator(failures=1)
    publisher = _publisher(tmp_path, FakeTrainer())
    assert publisher.publish([GeneratorHandle("g0", flaky, 4)]).attempts == 2 and flaky.version == 1
    broken = FakeGenerator(failures=10)
    with pytest.raises(PublishError, match="failed 3 times"):
        _publisher(tmp_path, FakeTrainer()).publish([GeneratorHandle("g0", broken, 4)])
    assert list(tmp_path.iterdir()) == []


def test_shared_memory_dir_is_private():
    path = shared_memory_dir()
    assert path.is_dir() and path.stat().st_mode & 0o077 == 0
