"""policy.generation.backend: megatron on the coordinator's side: the config's rules, what is
launched and waited for, membership of a trainer that is also a generator, and publishing to
a generator that shares the trainer's weights (no transfer, no group)."""

from pathlib import Path

import pytest
import structlog

from coordinator.config import ConfigError, load_config
from coordinator.launch.specs import all_registered, launch_all, trainer_settings
from coordinator.loop.weights.publisher import WeightPublisher
from coordinator.loop.weights.transports import CollectiveTransport
from coordinator.membership.registry import Member, Registry
from coordinator.membership.services import GeneratorHandle
from tandem.kinds import ServiceKind
from tandem.weight_sync import BucketPlan

LOG = structlog.get_logger()
MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", "policy.generation.backend=megatron"]


def test_megatron_generation_needs_megatron_training():
    with pytest.raises(ConfigError, match=r"policy\.megatron_cfg\.enabled=true"):
        load_config(overrides=["policy.generation.backend=megatron"])
    with pytest.raises(ConfigError, match="Input should be 'vllm' or 'megatron'"):
        load_config(overrides=["policy.generation.backend=sglang"])


def test_megatron_generation_refuses_colocation_and_warns_on_ignored_keys():
    with pytest.raises(ConfigError, match=r"colocated\.enabled=false"):
        load_config(overrides=[*MEGATRON, "policy.generation.colocated.enabled=true"])
    with pytest.warns(UserWarning, match="vllm_cfg is ignored"):
        load_config(overrides=[*MEGATRON, "policy.generation.vllm_cfg.max_num_seqs=8"])
    with pytest.warns(UserWarning, match="cluster.num_generators is ignored"):
        load_config(overrides=[*MEGATRON, "cluster.num_generators=2"])
    with pytest.warns(UserWarning, match="mcore_generation_config is ignored"):
        load_config(overrides=["policy.generation.mcore_generation_config.max_num_seqs=8"])


class _Launcher:
    def __init__(self):
        self.names = []

    def start(self, spec):
        self.names.append(spec.name)


def test_the_trainer_generates_and_no_generator_service_is_launched(tmp_path: Path):
    cfg = load_config(overrides=[*MEGATRON, "policy.generation.mcore_generation_config.max_num_seqs=32"])
    settings = trainer_settings(cfg, "model")
    assert settings.generation.enabled and settings.generation.max_num_seqs == 32
    assert settings.generation.max_model_len == cfg.policy.max_total_sequence_length
    assert not trainer_settings(load_config(), "model").generation.enabled
    launcher = _Launcher()
    launch_all(cfg, "model", tmp_path, "127.0.0.1:1", launcher)
    assert launcher.names == ["trainer", "reward-arithmetic"]
    ready = all_registered(cfg)
    trainer = Member("t", ServiceKind.TRAINER, "a:1")
    reward = Member("r", ServiceKind.REWARD, "a:3", tasks=("arithmetic",))
    assert not ready([trainer, reward])
    assert ready([trainer, Member("g", ServiceKind.GENERATOR, "a:1", shares_trainer_weights=True), reward])


def test_one_server_registers_as_trainer_and_generator():
    registry = Registry(LOG)
    trainer = registry.register("trainer", "h:1")
    generator = registry.register("generator", "h:1", shares_trainer_weights=True)
    assert {m.member_id for m in registry.live()} == {trainer, generator}
    again = registry.register("generator", "h:1", shares_trainer_weights=True)  # re-registering replaces its kind only
    assert {m.member_id for m in registry.live()} == {trainer, again}
    assert registry.live("generator")[0].shares_trainer_weights


class _Trainer:
    global_step = 0

    def __init__(self):
        self.groups = []

    def publish_weights(self, group, version, detach=False):
        self.groups.append(group)
        return type("R", (), {"bytes_sent": 0 if group.world_size == 1 else 10})()

    def info(self):
        return self


class _Generator:
    def __init__(self):
        self.received = []

    def info(self, timeout_s=0):
        return self

    def load_weights(self, source, version, timeout_s=0):
        self.received.append((source.group.world_size, source.rank, version))
        return version


def test_a_generator_sharing_the_trainers_weights_receives_nothing():
    trainer, shared, vllm = _Trainer(), _Generator(), _Generator()
    publisher = WeightPublisher(trainer, CollectiveTransport(trainer, "127.0.0.1:1", BucketPlan((), ()), LOG,
                                                             op_timeout_s=1.0), LOG)
    own = GeneratorHandle("g-trainer", shared, 8, shares_trainer_weights=True)
    report = publisher.publish([own])
    assert report.version == 1 and report.bytes_sent == 0
    assert trainer.groups[-1].world_size == 1 and not shared.received  # the trainer alone takes the version
    assert trainer.groups[-1].epoch == 0  # a real epoch (the trainer refuses a negative one)
    assert publisher.versions.is_current("g-trainer") and publisher.admit([own]) == [own]
    publisher.publish([own, GeneratorHandle("g-vllm", vllm, 8)])  # a vLLM generator beside it: a group of two
    assert trainer.groups[-1].world_size == 2 and vllm.received == [(2, 1, 2)] and not shared.received
    assert publisher.versions.is_current("g-trainer") and publisher.versions.is_current("g-vllm")
