"""policy.dtensor_cfg.* and policy.sequence_packing.* reach the trainer's settings (NeMo-RL key names)."""

from pathlib import Path

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.launch.specs import critic_settings, trainer_settings

RECIPES = Path(__file__).resolve().parents[4] / "examples" / "configs"


def test_sequence_packing_keys_reach_the_trainer():
    cfg = load_config(overrides=["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=512",
                                 "policy.sequence_packing.algorithm=concatenative"])
    packing = trainer_settings(cfg, "model").sequence_packing
    assert (packing.enabled, packing.train_mb_tokens, packing.logprob_mb_tokens, packing.algorithm) == (
        True, 512, 2048, "concatenative")
    with pytest.raises(ConfigError, match="policy.sequence_packing.algorithm"):
        load_config(overrides=["policy.sequence_packing.algorithm=best_fit"])


def test_dtensor_cfg_keys_reach_the_trainer():
    cfg = load_config(overrides=["policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.sequence_parallel=true",
                                 "policy.dtensor_cfg.cpu_offload=true", "policy.dtensor_cfg.activation_checkpointing=true"])
    dtensor = trainer_settings(cfg, "model").dtensor_cfg
    assert (dtensor.tensor_parallel_size, dtensor.sequence_parallel, dtensor.cpu_offload,
            dtensor.activation_checkpointing, dtensor.context_parallel_size) == (2, True, True, True, 1)


@pytest.mark.parametrize("overrides, message", [
    (["cluster.trainer_ranks=2", "policy.dtensor_cfg.tensor_parallel_size=4"],
     r"tensor_parallel_size \(4\) must divide cluster.trainer_ranks"),
    (["policy.dtensor_cfg.sequence_parallel=true"], "sequence_parallel needs tensor_parallel_size > 1"),
    (["policy.dtensor_cfg.context_parallel_size=2", "policy.dtensor_cfg.tensor_parallel_size=2"],
     "context_parallel_size > 1 with tensor_parallel_size > 1"),
    (["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.tensor_parallel_size=2"],
     "lora_cfg.enabled trains adapters without tensor parallel"),
    (["policy.dtensor_cfg.custom_parallel_plan=not-a-path"], "custom_parallel_plan must be a dotted path"),
])
def test_unsupported_layouts_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_context_parallel_loads_and_the_cpu_trainer_refuses_it_with_what_is_missing():
    import torch

    from trainer_svc.backends.dtensor.backend import check_context_parallel

    cfg = load_config(overrides=["policy.dtensor_cfg.context_parallel_size=2"])
    assert trainer_settings(cfg, "model").dtensor_cfg.context_parallel_size == 2  # the same YAML runs on GPUs
    with pytest.raises(ValueError, match=r"context_parallel_size=2 needs CUDA: .*ring attention"):
        check_context_parallel(2, torch.device("cpu"))
    check_context_parallel(1, torch.device("cpu"))
    with pytest.raises(ValueError, match="use megatron_cfg.context_parallel_size"):
        check_context_parallel(2, torch.device("cuda"))


def test_colocated_keys():
    assert load_config(overrides=["policy.generation.colocated.enabled=true"]).policy.generation.colocated.enabled
    with pytest.raises(ConfigError, match="leave them null"):
        load_config(overrides=["policy.generation.colocated.enabled=true",
                               "policy.generation.colocated.resources.gpus_per_node=2"])
    with pytest.warns(UserWarning, match="ignored by local runs"):
        load_config(overrides=["policy.generation.colocated.resources.num_nodes=1"])


def test_checkpointing_direct_io_reaches_the_trainers():
    assert trainer_settings(load_config(), "model").checkpoint_direct_io  # the default
    cfg = load_config(RECIPES / "ppo.yaml", overrides=["checkpointing.direct_io=false"])
    assert not trainer_settings(cfg, "model").checkpoint_direct_io
    assert not critic_settings(cfg, "model").checkpoint_direct_io
