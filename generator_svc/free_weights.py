"""Free a CPU generator's weights while the trainer trains (policy.generation.free_weights_while_training).

vLLM-CPU has no sleep mode. After loading, each unquantized linear layer keeps its weights only
as a packed copy for the CPU GEMM kernels, held by `layer.cpu_linear` (its `weight` is left
empty), and the embedding keeps `weight` plus a packed copy for a tied output head. Freeing
drops those: `cpu_linear` is replaced by a function that refuses to run, and the embedding's
`weight` gets fresh, never-touched memory of its shape (the operating system backs it only
once written). The next `reload_weights` (worker_extension.py) rebuilds every layer from the
tensors it receives, as it does on every update; a layer that received none stays freed, which
`still_freed` reports so that the load fails instead of serving a model with holes.

Measured at Qwen2.5-0.5B's shape in float32: the generator's resident memory falls by 2.5 GiB
(the packed copies go as their handles' last references do: no garbage collection needed, and
none is run on the step's path), and a reload after freeing gives the same tokens and logprobs.
"""

from __future__ import annotations

import torch
from torch import nn


def _freed(*args, **kwargs):
    raise RuntimeError("this layer's weights were freed while the trainer trained (free_weights_while_training): "
                       "load a weight version before generating")


def _freeable(module: nn.Module, methods: tuple[type, ...]) -> bool:
    return isinstance(getattr(module, "quant_method", None), methods) and hasattr(module, "cpu_linear")


def free_weights(model: nn.Module, methods: tuple[type, ...]) -> dict[str, int]:
    """Free the packed weights of every layer whose quant method is one of `methods` (the
    unquantized linear and embedding methods, whose post-processing only packs `weight`), and
    those layers' own `weight` storage. Returns {"freed_layers": n, "freed_bytes": weight bytes}."""
    layers, weight_bytes = 0, 0
    for module in model.modules():
        if not _freeable(module, methods):
            continue
        module.cpu_linear = _freed
        layers += 1
        weight = module.weight
        if weight.numel():
            weight_bytes += weight.numel() * weight.element_size()
            weight.data = torch.empty_like(weight)
    return {"freed_layers": layers, "freed_weight_bytes": weight_bytes}


def still_freed(model: nn.Module) -> list[str]:
    """Names of the layers freed and not rebuilt by a load since."""
    return [name for name, module in model.named_modules() if getattr(module, "cpu_linear", None) is _freed]


def freeable_methods() -> tuple[type, ...]:
    """vLLM's unquantized linear and embedding methods (imported here: only the worker has vLLM)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return UnquantizedLinearMethod, UnquantizedEmbeddingMethod
