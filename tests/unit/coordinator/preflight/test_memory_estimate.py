"""The run's expected peak memory per service (coordinator/preflight/memory.py) against figures
computed by hand for Qwen2.5-0.5B's shape, the workload-sized KV cache (tandem/model_memory.py),
and the refusal of a run that cannot fit the machine."""

import pytest

from coordinator.config import load_config
from coordinator.config.loading import ConfigError
from coordinator.preflight.memory import GIB, MIB, ServiceMemory, check_memory, estimate_memory
from tandem.model_memory import ModelShape, kv_cache_bytes

QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
N = 494_032_768
"""24 x (896*896 + 2*896*128 + 896*896 + q/k/v biases 1152 + MLP 3*896*4864 + norms 1792)
+ embedding 151936*896 (tied) + final norm 896."""
WORKLOAD = ["policy.generation.max_new_tokens=8", "policy.train_micro_batch_size=32",
            "policy.train_global_batch_size=32", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=8",
            "policy.max_total_sequence_length=32", "policy.generation.vllm_cfg.max_model_len=32"]


def test_the_shape_of_qwen2_5_0_5b_from_its_config():
    shape = ModelShape.from_config(QWEN_05B)
    assert shape.num_parameters == N
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.dtype) == (24, 2, 64, "bfloat16")
    assert shape.kv_bytes_per_token("float32") == 2 * 24 * 2 * 64 * 4 == 24576
    untied = ModelShape.from_config({**QWEN_05B, "tie_word_embeddings": False, "model_type": "llama"})
    assert untied.num_parameters == N + 151936 * 896 - 24 * 1152  # a second head, no q/k/v biases


def test_the_kv_cache_holds_the_workload_in_whole_blocks_with_a_margin():
    shape = ModelShape.from_config(QWEN_05B)
    assert kv_cache_bytes(shape, "float32", 256, 64) == 256 * 64 * 24576 * 5 // 4 == 480 * MIB
    assert kv_cache_bytes(shape, "float32", 256, 40) == 480 * MIB  # 40 tokens take two 32-token blocks
    assert kv_cache_bytes(shape, "bfloat16", 32, 32) == 32 * 32 * 12288 * 5 // 4 == 15 * MIB


def test_each_service_of_a_0_5b_run_by_hand():
    estimate = estimate_memory(load_config(overrides=WORKLOAD), ModelShape.from_config(QWEN_05B))
    trainer, generator, coordinator, reward = estimate.services
    assert trainer.parts == {
        "parameters": 4 * N, "adam": 8 * N, "reference": 2 * N,  # bfloat16 checkpoint: the reference at half size
        "gradients or parked weights": 4 * N,
        "logits": 32 * 9 * 151936 * 4 * 3, "activations": 32 * 32 * 24 * 896 * 16,
        "publish": 151936 * 896 * 4,  # the embedding, larger than two 64 MiB buckets
        "base": 512 * MIB}
    assert generator.count == 1 and generator.parts == {
        "weights": 4 * N, "kv cache": 256 * 32 * 24576 * 5 // 4, "weight update": 8 * N + 128 * MIB,
        "base": 1152 * MIB}
    assert coordinator.each == 448 * MIB and reward.each == 96 * MIB
    rest = coordinator.each + reward.each
    # the generator frees its weights while the trainer trains (a synchronous CPU run's default);
    # the trainer's gradients, logits and activations exist only then
    training = trainer.each + generator.parts["kv cache"] + generator.parts["base"] + rest
    otherwise = trainer.each - 4 * N - trainer.parts["logits"] - trainer.parts["activations"] + generator.each + rest
    assert estimate.total == max(training, otherwise) == otherwise
    assert round(trainer.each / GIB, 2) == 10.11 and round(estimate.total / GIB, 1) == 15.0
    assert "(while the trainer trains 12.0, otherwise 15.0)" in estimate.describe()
    kept = estimate_memory(load_config(overrides=[*WORKLOAD, "policy.generation.free_weights_while_training=false"]),
                           ModelShape.from_config(QWEN_05B))
    kept_training = training + generator.parts["weights"]
    assert sum(s.while_training() for s in kept.services) == kept_training and kept.total == max(kept_training, otherwise)
    assert "trainer 10.11 GiB (parameters 1.84, adam 3.68, reference 0.92" in estimate.describe()

    fixed = estimate_memory(load_config(overrides=[*WORKLOAD, "policy.generation.vllm_cfg.kv_cache_space_gib=1",
                                                   "cluster.num_generators=2", "cluster.trainer_ranks=2",
                                                   "policy.precision=bfloat16"]), ModelShape.from_config(QWEN_05B))
    trainer, generator = fixed.services[:2]
    assert generator.count == 2 and generator.parts["kv cache"] == GIB and generator.parts["weights"] == 2 * N
    assert trainer.parts["reference"] == 2 * N and trainer.parts["adam"] == 4 * N and trainer.parts["base"] == GIB
    assert fixed.total == max(sum(s.while_training() for s in fixed.services), sum(s.otherwise() for s in fixed.services))


def test_a_run_that_cannot_fit_is_refused_before_it_starts():
    cfg = load_config(overrides=WORKLOAD)
    estimate = estimate_memory(cfg, ModelShape.from_config(QWEN_05B))
    check_memory(cfg, estimate, 24 * GIB)
    check_memory(cfg, estimate, None)  # unknown: not refused
    with pytest.raises(ConfigError) as err:
        check_memory(cfg, estimate, 12 * GIB)
    message = str(err.value)
    assert "needs about 15.0 GiB" in message and "has 12.0 GiB available" in message
    assert "trainer 10.11 GiB" in message and "generator 7.01 GiB" in message
    assert "policy.precision=bfloat16" in message and "policy.train_micro_batch_size" in message
    external = load_config(overrides=[*WORKLOAD, "cluster.launch=external"])
    check_memory(external, estimate_memory(external, ModelShape.from_config(QWEN_05B)), GIB)  # nothing started here


def test_a_ppo_run_counts_its_critic():
    # the critic: the policy's body in fp32 (4 N), Adam 8 N, gradients 4 N, the activations of a
    # micro-batch of 8 (ppo.critic.train_micro_batch_size) and one trainer rank's base
    estimate = estimate_memory(load_config(overrides=[*WORKLOAD, "ppo.critic.train_micro_batch_size=8"]),
                               ModelShape.from_config(QWEN_05B))
    critic = next(s for s in estimate.services if s.name == "critic")
    assert critic.count == 1 and critic.parts == {"parameters": 4 * N, "adam": 8 * N, "gradients": 4 * N,
                                                  "activations": 8 * 32 * 24 * 896 * 16, "base": 512 * MIB}
    without = estimate_memory(load_config(overrides=WORKLOAD), ModelShape.from_config(QWEN_05B))
    # it trains while the policy's trainer trains: its gradients and activations count in that phase only
    training, rest = (sum(f(s) for s in estimate.services) for f in (ServiceMemory.while_training,
                                                                       ServiceMemory.otherwise))
    assert training == sum(s.while_training() for s in without.services) + critic.each
    assert rest == sum(s.otherwise() for s in without.services) + 12 * N + 512 * MIB
    assert estimate.total == max(training, rest)
