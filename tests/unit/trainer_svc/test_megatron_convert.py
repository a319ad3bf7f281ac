"""The HF <-> Megatron converter as pure tensor functions (the logits against HF are checked
on real torchrun ranks in tests/integration/test_megatron_backend.py), and the conversion
cache's directory priority and entry key."""

from pathlib import Path

import pytest
import torch

from trainer_svc.backends.megatron import cache
from trainer_svc.backends.megatron.convert import (
    Arch,
    Shard,
    hf_names_in_order,
    hf_shapes,
    hf_to_megatron,
    megatron_names_in_order,
    megatron_to_hf,
)


def _random_hf(arch: Arch, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) for name, shape in hf_shapes(arch).items()}


def _arch(family: str, tie: bool) -> Arch:
    return Arch(family, num_layers=4, hidden_size=64, ffn_hidden_size=96, num_heads=4, num_kv_heads=2, head_dim=16,
                vocab_size=83, max_position_embeddings=32, rope_theta=1e4, norm_eps=1e-6,
                qkv_bias=family == "qwen2", tie_word_embeddings=tie)


@pytest.mark.parametrize("family, tie", [("llama", False), ("qwen2", True)])
@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_round_trip_is_exact_at_every_layout(family, tie, tp, pp):
    arch = _arch(family, tie)
    hf = _random_hf(arch)
    per_stage = arch.num_layers // pp
    back: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        layout = [Shard(r, tp, stage * per_stage, per_stage, stage == 0, stage == pp - 1, arch.padded_vocab(tp))
                  for r in range(tp)]
        shards = [hf_to_megatron(hf.__getitem__, arch, shard) for shard in layout]
        names = megatron_names_in_order(arch, layout[0])
        assert set(shards[0]) - set(names) <= {"output_layer.weight"}  # tied: the embedding is exported
        for name in names:
            for hf_name, tensor in megatron_to_hf(name, [s[name] for s in shards], arch, stage * per_stage):
                back[hf_name] = tensor
    assert list(back) == hf_names_in_order(arch) == list(hf_shapes(arch))  # the bucket plan's order
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_qkv_is_interleaved_per_query_group():
    arch = _arch("llama", False)
    hf = _random_hf(arch)
    mg = hf_to_megatron(hf.__getitem__, arch, Shard(0, 1, 0, 4, True, True, 83))
    qkv = mg["decoder.layers.0.self_attention.linear_qkv.weight"]
    d = arch.head_dim
    # group 0: query heads 0-1, key head 0, value head 0
    assert torch.equal(qkv[:2 * d], hf["model.layers.0.self_attn.q_proj.weight"][:2 * d])
    assert torch.equal(qkv[2 * d:3 * d], hf["model.layers.0.self_attn.k_proj.weight"][:d])
    assert torch.equal(qkv[3 * d:4 * d], hf["model.layers.0.self_attn.v_proj.weight"][:d])
    assert torch.equal(qkv[4 * d:6 * d], hf["model.layers.0.self_attn.q_proj.weight"][2 * d:4 * d])


def test_vocab_is_padded_for_tp_and_cut_on_export():
    arch = _arch("llama", False)
    hf = _random_hf(arch)
    shards = [hf_to_megatron(hf.__getitem__, arch, Shard(r, 2, 0, 4, True, True, 84)) for r in range(2)]
    assert shards[1]["embedding.word_embeddings.weight"].shape == (42, 64)
    assert torch.all(shards[1]["output_layer.weight"][-1] == 0)


def test_cache_dir_priority(tmp_path):
    assert cache.cache_dir({"TANDEM_MEGATRON_CHECKPOINT_DIR": "/a", "HF_HOME": "/b", "HOME": "/c"}) == Path("/a")
    assert cache.cache_dir({"HF_HOME": "/b", "HOME": "/c"}) == Path("/b/tandem")
    assert cache.cache_dir({"HOME": "/c"}) == Path("/c/.cache/huggingface/tandem")


def test_cache_entry_changes_with_the_source_and_the_vocab(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"x" * 10)
    first = cache.entry_name(model, "llama", 84)
    assert cache.entry_name(model, "llama", 84) == first
    assert cache.entry_name(model, "llama", 86) != first
    (model / "model.safetensors").write_bytes(b"y" * 11)
    assert cache.entry_name(model, "llama", 84) != first
    assert not cache.is_complete(tmp_path / first)


def test_mistral_converts_as_llama_only_without_a_sliding_window():
    from types import SimpleNamespace

    config = dict(model_type="mistral", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=83, max_position_embeddings=64,
                  rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, hidden_act="silu",
                  tie_word_embeddings=False)
    arch = Arch.from_hf_config(SimpleNamespace(**config, sliding_window=None))
    assert arch.family == "mistral" and not arch.qkv_bias and arch.head_dim == 16
    with pytest.raises(ValueError, match="sliding_window 32 is not supported by the Megatron converter"):
        Arch.from_hf_config(SimpleNamespace(**config, sliding_window=32))
