"""The seed options' settings and refusals, without starting services: NeMo-RL's keys reach the
services' settings, inconsistent values are refused at load, options this machine cannot run
are refused at start naming the key and what is missing, and LoRA's pure parts (dropout and the
on-policy shortcut, the merged weights against PEFT's merge)."""

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from coordinator.config import ConfigError, load_config
from coordinator.launch.specs import generator_settings, trainer_settings
from trainer_svc.backends.megatron import gpu_features
from trainer_svc.backends.megatron.model import check_supported
from trainer_svc.backends.megatron.moe import arch_from_hf_config
from trainer_svc.config.lora import LoraSettings
from trainer_svc.config.megatron import Fp8Settings, MegatronSettings


def test_nemo_rl_keys_reach_the_services():
    cfg = load_config(overrides=[
        "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", "policy.megatron_cfg.expert_model_parallel_size=2",
        "policy.megatron_cfg.freeze_moe_router=true", "policy.megatron_cfg.fp8_cfg.enabled=true",
        "policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise", "policy.megatron_cfg.bias_activation_fusion=true",
        "policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.dim=16",
        "policy.generation.vllm_cfg.tensor_parallel_size=2"])
    m = trainer_settings(cfg, "model").megatron_cfg
    assert (m.expert_model_parallel_size, m.freeze_moe_router, m.fp8_cfg.fp8_recipe) == (2, True, "tensorwise")
    assert trainer_settings(cfg, "model").dtensor_cfg.lora_cfg.dim == 16
    gen = generator_settings(cfg, "model", 0, Path("scratch"))
    assert (gen.tensor_parallel_size, gen.distributed_executor_backend, gen.num_workers) == (2, "mp", 2)


@pytest.mark.parametrize("overrides, message", [
    (["policy.generation.vllm_cfg.pipeline_parallel_size=2", "policy.generation.vllm_cfg.distributed_executor_backend=uni"],
     "needs mp"),
    (["policy.megatron_cfg.fp8_cfg.fp8_recipe=fancy"], "policy.megatron_cfg.fp8_cfg.fp8_recipe"),
    (["policy.megatron_cfg.fp8_cfg.fp8_param=true"], "fp8_param needs fp8_cfg.enabled"),
    (["policy.megatron_cfg.moe_enable_deepep=true"], "needs moe_token_dispatcher_type: flex"),
    (["policy.megatron_cfg.moe_shared_expert_overlap=true"], "needs moe_token_dispatcher_type: alltoall"),
    (["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.dropout=0.1"], "dropout_position: pre"),
    (["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.match_all_linear=false"],
     "set target_modules"),
])
def test_inconsistent_values_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_gpu_only_options_are_refused_on_cpu_naming_each_key():
    cfg = MegatronSettings(enabled=True, fp8_cfg=Fp8Settings(enabled=True), moe_permute_fusion=True,
                           moe_token_dispatcher_type="flex", context_parallel_size=2)
    with pytest.raises(ValueError) as error:
        gpu_features.check_device(cfg, on_gpu=False)
    for key in ("fp8_cfg.enabled", "context_parallel_size > 1", "moe_permute_fusion", "moe_token_dispatcher_type: flex",
                "needs Transformer Engine on a GPU", "no CUDA device"):
        assert key in str(error.value)
    gpu_features.check_device(MegatronSettings(enabled=True, bias_activation_fusion=True), on_gpu=False)  # runs on CPU
    with pytest.raises(ValueError, match="need Transformer Engine, which is not installed"):
        gpu_features.check_device(cfg.model_copy(update={"moe_token_dispatcher_type": "allgather"}), on_gpu=True,
                                  te_available=False)
    fp8 = MegatronSettings(enabled=True, fp8_cfg=Fp8Settings(enabled=True, fp8_recipe="blockwise"))
    with pytest.raises(ValueError, match="needs a GPU of compute capability 9.0"):
        gpu_features.check_device(fp8, on_gpu=True, te_available=True, capability=(8, 9))
    gpu_features.check_device(fp8, on_gpu=True, te_available=True, capability=(9, 0))
    assert gpu_features.uses_te(fp8, on_gpu=True) and not gpu_features.uses_te(fp8, on_gpu=False)


def test_transformer_engine_names_of_the_fused_norms():
    for name, moe_layer in [("decoder.layers.3.input_layernorm.weight", False),
                            ("decoder.layers.0.pre_mlp_layernorm.weight", False),
                            ("decoder.layers.0.self_attention.linear_proj.weight", False)]:
        assert gpu_features.local_name(gpu_features.te_name(name, moe_layer)) == name
    assert gpu_features.te_name("decoder.layers.0.pre_mlp_layernorm.weight", True).endswith("pre_mlp_layernorm.weight")


def _qwen2_moe():
    from transformers import Qwen2MoeConfig

    return arch_from_hf_config(Qwen2MoeConfig(vocab_size=83, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=24,
                                              shared_expert_intermediate_size=40, num_experts=4, num_experts_per_tok=2))


@pytest.mark.parametrize("options, world, message", [
    ({"expert_model_parallel_size": 3}, 3, "must divide the model's 4 experts"),
    ({"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2}, 4, "sequence_parallel must be true"),
    ({"pipeline_model_parallel_size": 2}, 2, "not supported yet"),
    ({"expert_model_parallel_size": 2}, 3, "not a multiple of megatron_cfg expert_tensor"),
])
def test_moe_layouts_that_cannot_run_name_the_key(options, world, message):
    with pytest.raises(ValueError, match=message):
        check_supported(MegatronSettings(enabled=True, **options), _qwen2_moe(), world_size=world, on_gpu=True)


def test_lora_settings():
    assert LoraSettings(enabled=True, dim=8, alpha=32).scaling == 4.0
    assert LoraSettings(enabled=True, dropout=0.1, dropout_position="pre").dropout == 0.1
    with pytest.raises(ValidationError, match="lora_A_init"):
        LoraSettings(lora_A_init="normal")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()


def test_lora_dropout_turns_the_on_policy_shortcut_off():
    from trainer_svc.backends.dtensor import lora
    from trainer_svc.backends.dtensor.model import dropout_free
    from trainer_svc.losses import build_loss_fn, previous_logprobs_needed
    from trainer_svc.types import GrpoLossConfig

    grpo = build_loss_fn(GrpoLossConfig())
    plain = lora.wrap(_tiny_llama(), LoraSettings(enabled=True))
    dropped = lora.wrap(_tiny_llama(), LoraSettings(enabled=True, dropout=0.1, dropout_position="pre"))
    assert dropout_free(plain) and not previous_logprobs_needed(grpo, 0, dropout_free(plain))
    assert not dropout_free(dropped) and previous_logprobs_needed(grpo, 0, dropout_free(dropped))


def test_merged_weights_equal_peft_merge():
    from trainer_svc.backends.dtensor import lora
    from trainer_svc.held_bytes import HeldBytes

    cfg = LoraSettings(enabled=True, match_all_linear=False, target_modules=("q_proj", "down_proj"), dim=4, alpha=8,
                       lora_A_init="uniform")
    base = _tiny_llama()
    names = list(base.state_dict())
    model = lora.wrap(base, cfg)
    lora.init_adapters(model, cfg, seed=3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_()  # B starts at zero: give the merge something to add
    merged = dict(lora.iter_merged(model, names, cfg.scaling, 0, HeldBytes()))
    expected = model.merge_and_unload().state_dict()
    assert list(merged) == names
    assert max((merged[n] - expected[n]).abs().max().item() for n in names) < 1e-6
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], _tiny_llama().model.layers[0].self_attn.q_proj.weight)


def test_slurm_gives_a_parallel_generator_one_gpu_per_vllm_worker():
    from coordinator.launch.slurm import plan

    cfg = load_config(overrides=["cluster.gpus_per_node=8", "cluster.trainer_ranks=8", "cluster.num_generators=4",
                                 "policy.generation.vllm_cfg.tensor_parallel_size=2",
                                 "cluster.launch=external"])  # as `tandem slurm` loads it: generators on nodes of their own
    layout = plan(cfg)
    assert (layout.gpus_per_generator, layout.generator_nodes, layout.generators_per_node) == (2, 1, 4)
