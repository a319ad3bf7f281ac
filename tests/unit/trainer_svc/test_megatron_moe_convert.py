"""The mixture-of-experts converter as pure tensor functions: HF configs of Qwen2-MoE and Mixtral
read into an arch, the round trip HF -> (TP, EP, ETP shards) -> HF exact at every layout, experts
placed on the right EP rank, and the export order the EP all-gather produces. Logits against HF
on real ranks: tests/integration/test_megatron_moe.py."""

import pytest
import torch

from trainer_svc.backends.megatron.convert import Shard
from trainer_svc.backends.megatron.moe import (
    ExpertShard,
    arch_from_hf_config,
    expert_order,
    hf_names_in_order,
    hf_shapes,
    hf_to_megatron,
    is_moe,
    megatron_names_in_order,
    megatron_to_hf,
)


def _config(family: str):
    from transformers import LlamaConfig, MixtralConfig, Qwen2MoeConfig

    common = dict(vocab_size=83, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=32)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(**common, intermediate_size=96, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                              num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)
    if family == "mixtral":
        return MixtralConfig(**common, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
    return LlamaConfig(**common, intermediate_size=96)


def test_configs_become_moe_archs():
    qwen = arch_from_hf_config(_config("qwen2_moe"))
    mixtral = arch_from_hf_config(_config("mixtral"))
    assert is_moe(qwen) and is_moe(mixtral) and not is_moe(arch_from_hf_config(_config("llama")))
    assert (qwen.moe.num_experts, qwen.moe.topk, qwen.moe.expert_ffn, qwen.moe.shared_ffn) == (4, 2, 24, 40)
    assert qwen.moe.pre_softmax and qwen.qkv_bias and qwen.family == "qwen2_moe"
    assert not mixtral.moe.pre_softmax and not mixtral.qkv_bias and mixtral.moe.shared_ffn == 0
    config = _config("qwen2_moe")
    config.mlp_only_layers = [1]
    with pytest.raises(ValueError, match="every layer must be a MoE layer"):
        arch_from_hf_config(config)


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
@pytest.mark.parametrize("tp, ep, etp", [(1, 1, 1), (1, 2, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2)])
def test_round_trip_is_exact_at_every_expert_layout(family, tp, ep, etp):
    arch = arch_from_hf_config(_config(family))
    gen = torch.Generator().manual_seed(0)
    hf = {name: torch.randn(shape, generator=gen) for name, shape in hf_shapes(arch, ep).items()}
    ranks = {(r, e, t): hf_to_megatron(hf.__getitem__, arch, Shard(r, tp, 0, 2, True, True, arch.padded_vocab(tp)),
                                       ExpertShard(e, ep, t, etp))
             for r in range(tp) for e in range(ep) for t in range(etp)}
    local = arch.moe.num_experts // ep
    back = {}
    for name in megatron_names_in_order(arch, Shard(0, tp, 0, 2, True, True, arch.padded_vocab(tp)), ep):
        if ".local_experts." in name:  # global index g: EP rank g // local, local index g % local, over ETP ranks
            g = int(name.split(".")[6])
            local_name = name.replace(f"local_experts.{g}.", f"local_experts.{g % local}.")
            shards = [ranks[(0, g // local, t)][local_name] for t in range(etp)]
        else:
            shards = [ranks[(r, 0, 0)][name] for r in range(tp)]
        back.update(megatron_to_hf(name, shards, arch, 0))
    assert list(back) == hf_names_in_order(arch, ep) == list(hf_shapes(arch, ep))
    assert set(back) == set(hf) and all(torch.equal(back[n], hf[n]) for n in hf)


def test_experts_land_on_their_ep_rank_and_export_in_gather_order():
    arch = arch_from_hf_config(_config("mixtral"))
    hf = {name: torch.randn(shape) for name, shape in hf_shapes(arch).items()}
    rank1 = hf_to_megatron(hf.__getitem__, arch, Shard(0, 1, 0, 2, True, True, 83), ExpertShard(1, 2))
    fc2 = rank1["decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"]
    assert torch.equal(fc2, hf["model.layers.1.block_sparse_moe.experts.2.w2.weight"])  # experts 2, 3 on EP rank 1
    assert "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight" not in rank1
    assert expert_order(arch, 2) == [0, 2, 1, 3]  # one all-gather of local expert j gives experts j, 2 + j
