"""Placement (coordinator/config/placement.py): which GPUs each local service takes, decided at
config load, the environment each launched process gets, and the weight transport that follows."""

from pathlib import Path

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.config.placement import GeneratorDevices, place
from coordinator.launch.specs import gpu_memory_utilization, launch_all
from tandem.colocation import WeightTransport, resolve_colocation

BATCH = ["policy.train_global_batch_size=8", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4"]


def _cfg(*overrides):
    return load_config(overrides=[*BATCH, *overrides])


class _Launcher:
    def __init__(self):
        self.env = {}

    def start(self, spec):
        self.env[spec.name] = spec.env


def _visible(cfg, tmp_path):
    launcher = _Launcher()
    launch_all(cfg, "model", tmp_path, "127.0.0.1:1", launcher)
    return {name: env.get("CUDA_VISIBLE_DEVICES") for name, env in launcher.env.items()}


def _transport(cfg):
    return resolve_colocation(cfg.policy.generation.colocated.enabled, "cuda" if cfg.cluster.gpus_per_node else "cpu",
                              shares_device=cfg.generators_share_trainer_device)


def test_cpu_nodes_place_nothing(tmp_path: Path):
    cfg = _cfg("cluster.num_generators=2")
    assert cfg.placement.trainer == () and cfg.placement.trainer_env() == {}
    assert _visible(cfg, tmp_path) == {"trainer": None, "generator-0": None, "generator-1": None,
                                       "reward-arithmetic": None}
    assert _transport(cfg).transport is WeightTransport.GROUP


def test_one_gpu_colocated_shares_gpu_0_by_cuda_ipc_and_sleeps(tmp_path: Path):
    cfg = _cfg("cluster.gpus_per_node=1", "policy.generation.colocated.enabled=true")
    assert cfg.placement.generators == (GeneratorDevices((0,), True),)
    assert _visible(cfg, tmp_path) == {"trainer": "0", "generator-0": "0", "reward-arithmetic": None}
    assert _transport(cfg).transport is WeightTransport.CUDA_IPC and _transport(cfg).sleeps
    assert gpu_memory_utilization(cfg) == 0.5


def test_one_gpu_dedicated_shares_gpu_0_by_cuda_ipc_without_sleeping(tmp_path: Path):
    cfg = _cfg("cluster.gpus_per_node=1")
    assert cfg.placement.generators == (GeneratorDevices((0,), True),)
    assert _visible(cfg, tmp_path)["generator-0"] == "0"
    colocation = _transport(cfg)
    assert colocation.transport is WeightTransport.CUDA_IPC and not colocation.sleeps
    assert gpu_memory_utilization(cfg) == 0.5  # not 0.9: the trainer is on the same GPU


def test_eight_gpus_trainer_four_and_two_tp2_generators_get_gpus_of_their_own(tmp_path: Path):
    cfg = _cfg("cluster.gpus_per_node=8", "cluster.trainer_ranks=4", "cluster.num_generators=2",
               "policy.generation.vllm_cfg.tensor_parallel_size=2")
    assert cfg.placement.trainer == (0, 1, 2, 3)
    assert _visible(cfg, tmp_path) == {"trainer": "0,1,2,3", "generator-0": "4,5", "generator-1": "6,7",
                                       "reward-arithmetic": None}
    assert _transport(cfg).transport is WeightTransport.GROUP  # NCCL between GPUs
    assert gpu_memory_utilization(cfg) == 0.9


def test_colocated_tp2_generators_run_on_the_trainers_first_gpus(tmp_path: Path):
    cfg = _cfg("cluster.gpus_per_node=8", "cluster.trainer_ranks=4", "cluster.num_generators=2",
               "policy.generation.colocated.enabled=true", "policy.generation.vllm_cfg.tensor_parallel_size=2")
    assert _visible(cfg, tmp_path) == {"trainer": "0,1,2,3", "generator-0": "0,1", "generator-1": "0,1",
                                       "reward-arithmetic": None}


@pytest.mark.parametrize("overrides, keys", [
    (["cluster.gpus_per_node=8", "cluster.trainer_ranks=4", "cluster.num_generators=4",
      "policy.generation.vllm_cfg.tensor_parallel_size=2"], ["cluster.trainer_ranks (4)", "cluster.num_generators (4)",
                                                             "= 12 GPUs", "cluster.gpus_per_node is 8"]),
    (["cluster.gpus_per_node=8", "cluster.num_generators=1"], ["cluster.trainer_ranks (8)", "= 9 GPUs"]),
    (["cluster.gpus_per_node=2", "cluster.trainer_ranks=4"],
     ["cluster.trainer_ranks (4) exceeds cluster.gpus_per_node"]),
    (["cluster.gpus_per_node=2", "cluster.trainer_ranks=1", "policy.generation.colocated.enabled=true",
      "policy.generation.vllm_cfg.tensor_parallel_size=2"], ["tensor_parallel_size", "cluster.trainer_ranks (1)"]),
    (["cluster.gpus_per_node=1", "policy.generation.vllm_cfg.tensor_parallel_size=2"], ["= 3 GPUs"]),
])
def test_a_layout_that_does_not_fit_fails_at_load_naming_the_keys(overrides, keys):
    with pytest.raises(ConfigError) as info:
        _cfg(*overrides)
    for key in keys:
        assert key in str(info.value)


def test_external_launch_is_placed_by_its_orchestrator():
    cfg = _cfg("cluster.launch=external", "cluster.gpus_per_node=8", "cluster.num_generators=2")  # no error
    assert not cfg.generators_share_trainer_device


def test_place_counts_one_gpu_per_vllm_worker():
    placement = place(8, 2, 3, 2, colocated=False)
    assert [g.devices for g in placement.generators] == [(2, 3), (4, 5), (6, 7)]
    assert placement.generator_env(2) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert not placement.generators_share_trainer_device


class _OrderLauncher:
    def __init__(self, order):
        self.order = order

    def start(self, spec):
        self.order.append(spec.name)


@pytest.mark.parametrize("overrides, first", [
    (["cluster.gpus_per_node=1", "policy.generation.colocated.enabled=true"], True),
    (["cluster.gpus_per_node=1"], True),  # dedicated on the trainer's only GPU
    (["cluster.gpus_per_node=2", "cluster.trainer_ranks=1"], False),  # a GPU of its own: no wait
    (["policy.generation.colocated.enabled=true"], False),  # CPU: vLLM does not profile device memory
])
def test_generators_on_the_trainers_gpu_start_once_the_trainer_registered(tmp_path: Path, overrides, first):
    order = []
    launch_all(_cfg(*overrides), "model", tmp_path, "127.0.0.1:1", _OrderLauncher(order),
               trainer_ready=lambda: order.append("trainer registered"))
    expected = ["trainer", "trainer registered", "generator-0"] if first else ["trainer", "generator-0"]
    assert order[:len(expected)] == expected and order.count("trainer registered") == int(first)


@pytest.mark.parametrize("overrides, eager", [
    ([], True),  # CPU: no torch.compile (30-50 s of start-up for nothing)
    (["cluster.gpus_per_node=2", "cluster.trainer_ranks=1"], False),  # GPU: CUDA graphs and compile
    (["cluster.gpus_per_node=2", "cluster.trainer_ranks=1", "policy.generation.vllm_cfg.enforce_eager=true"], True),
    (["policy.generation.vllm_cfg.enforce_eager=false"], False),
])
def test_eager_by_default_on_cpu_only_and_vllm_gpu_defaults_pinned_off(tmp_path: Path, overrides, eager):
    import tempfile

    from coordinator.launch.specs import generator_settings
    from generator_svc.config import vllm_environment

    with tempfile.TemporaryDirectory(prefix="g") as short:  # vLLM's socket paths: a short scratch dir
        settings = generator_settings(_cfg(*overrides), "model", 0, Path(short))
    assert settings.enforce_eager is eager
    assert settings.async_scheduling is False and settings.model_runner_v2 is False
    env = vllm_environment(settings, {}, tmp_path / "run")
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert ("TORCHDYNAMO_DISABLE" in env) is eager
