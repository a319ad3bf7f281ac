"""Keep a tied output head in step with the embedding it shares, after an in-place reload.

vLLM builds a tied model's output head (`lm_head`, a ParallelLMHead) as its own module whose
`weight` is the embedding's Parameter. On CPU, loading ends with each layer's
`quant_method.process_weights_after_loading`, which for an (unquantized) embedding or head
packs a second copy of the weight for the CPU GEMM kernels (oneDNN / sgl `cpu_linear`); the
logits are computed from that packed copy, not from `weight`.

`model_runner.reload_weights` (vLLM 0.32's layerwise reload) re-processes only the layers that
received tensors. A tied checkpoint has no `lm_head.weight` (HF's save_pretrained and both
trainer backends leave the duplicate out, and Llama's loader would skip it anyway), so the
head's `weight` changes with the embedding's storage while its packed copy keeps the weights
the engine STARTED with: after the first update the generator samples from a head the trainer
no longer has (measured: logprob differences of 0.16 after 4 SFT steps, 4-8 for a foreign
checkpoint). Gemma-2's vLLM model computes logits from `embed_tokens` itself and was not hit.

`refresh_tied_layers` re-runs that post-processing for every layer that holds a parameter
another layer also holds. On GPU the unquantized methods do nothing there (the head reads
`weight` directly), so the call is a no-op; it runs after every transport (weight-sync group,
shared memory, CUDA IPC), all of which end in the same reload.

When the reload has just packed the same parameter for another layer of the same method (the
embedding, whose packed copy only a head reads), the head takes that packed copy (`cpu_linear`)
instead of packing its own: the same bytes, one pack and one copy fewer per update (at
Qwen2.5-0.5B's shape 545 MB and 0.4-0.7 s of every publish).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def layers_sharing_parameters(model: nn.Module) -> list[nn.Module]:
    """Modules holding (directly) a parameter that another module holds too, in module order."""
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders = owners.setdefault(id(param), [])
            if not any(m is module for m in holders):
                holders.append(module)
    shared = {id(m) for holders in owners.values() if len(holders) > 1 for m in holders}
    return [m for m in model.modules() if id(m) in shared]


def refresh_tied_layers(model: nn.Module, methods: Iterable[type], reloaded: Iterable[str] = ()) -> list[str]:
    """Re-run `process_weights_after_loading` of each tied layer whose quant method is one of
    `methods` (methods whose post-processing only derives kernel data from `weight`, so running
    it again is safe), except the layers named in `reloaded` (the reload processed them already).
    Returns the refreshed layers' names."""
    kinds, skip = tuple(methods), set(reloaded)
    names = {id(m): name for name, m in model.named_modules()}
    tied = layers_sharing_parameters(model)
    refreshed = []
    for layer in tied:
        method = getattr(layer, "quant_method", None)
        if isinstance(method, kinds) and names[id(layer)] not in skip:
            packed = _packed_by_a_twin(layer, tied, skip, names)
            if packed is not None:
                layer.cpu_linear = packed
            else:
                method.process_weights_after_loading(layer)
            refreshed.append(names[id(layer)])
    return refreshed


def _packed_by_a_twin(layer: nn.Module, tied: list[nn.Module], reloaded: set[str], names: dict[int, str]):
    """The CPU kernel (`cpu_linear`) a reloaded layer holding the same `weight` under the same
    quant method packed just now, or None."""
    for twin in tied:
        if (twin is not layer and names[id(twin)] in reloaded and getattr(twin, "weight", None) is layer.weight
                and type(getattr(twin, "quant_method", None)) is type(layer.quant_method)
                and hasattr(twin, "cpu_linear")):
            return twin.cpu_linear
    return None


def unquantized_embedding_methods() -> tuple[type, ...]:
    """vLLM's unquantized embedding / head method (imported here: only the worker has vLLM)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return (UnquantizedEmbeddingMethod,)
