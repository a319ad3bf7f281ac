"""Where this rank's Megatron model is built and kept, decided once from the trainer's device.

On CUDA the model follows Megatron-LM's own `get_model` (megatron/training/training.py): the
layers allocate their weights on the current CUDA device (`use_cpu_initialization` False) and
the whole module is then moved there with `.cuda(torch.cuda.current_device())` (what the layers
still build on the CPU, e.g. torch's norms, follows), before `DistributedDataParallel` wraps
it: megatron-core's `_ParamAndGradBuffer` (distributed/param_and_grad_buffer.py) allocates the
grad (and distributed-optimizer param) buffers on `torch.cuda.current_device()` and views the
parameters into them, so parameters left on the CPU would meet CUDA grads and inputs.

On the CPU nothing changes: weights initialised on the CPU and the compatibility layer
(cpu_compat.py) that turns megatron-core's CUDA calls into CPU ones.

Sequence parallelism with the local (torch-module) layer spec: its RMSNorm is always
`WrappedTorchNorm` (megatron-core's `LocalSpecProvider.layer_norm(rms_norm=True)`), which
asserts `not config.sequence_parallel` on every device. The norm is correct under SP once its
weights are marked `sequence_parallel` (see `allow_torch_norm_under_sp`), so that patch goes
with the local spec and SP, CUDA or not; Transformer Engine's spec (TENorm) supports SP itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_NORM_PATCHED = False


@dataclass(frozen=True)
class ModelPlacement:
    """The init/placement plan of a Megatron model on one device type."""

    device: torch.device
    sequence_parallel: bool = False
    use_te: bool = False

    @classmethod
    def for_device(cls, device: torch.device | str, *, sequence_parallel: bool = False,
                   use_te: bool = False) -> ModelPlacement:
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"the Megatron backend runs on cpu or cuda devices, not {device.type!r}")
        return cls(device, sequence_parallel, use_te)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def cpu_initialization(self) -> bool:
        """TransformerConfig.use_cpu_initialization."""
        return not self.on_gpu

    @property
    def cpu_compat(self) -> bool:
        """Whether megatron-core's CUDA calls are rewritten to the CPU (cpu_compat.py)."""
        return not self.on_gpu

    @property
    def torch_norm_sp_patch(self) -> bool:
        """Whether the local spec's torch norm is built under sequence parallelism (see module doc)."""
        return self.sequence_parallel and not self.use_te

    def prepare(self) -> None:
        """Process-wide patches this plan needs before the model is built (idempotent); the CPU
        layer itself is installed by `model.init_model_parallel` (cpu_compat.install, CPU only)."""
        if self.torch_norm_sp_patch:
            allow_torch_norm_under_sp()

    def target(self) -> torch.device:
        """The device the built model must be on before DDP wraps it (the current CUDA device on GPU)."""
        if not self.on_gpu:
            return torch.device("cpu")
        current = torch.cuda.current_device()
        if self.device.index is not None and self.device.index != current:
            raise RuntimeError(f"the trainer's device is {self.device} but the current CUDA device is cuda:{current}; "
                               "torch.cuda.set_device must run before the model is built")
        return torch.device("cuda", current)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move the built model to `target()` (in place; a no-op on the CPU)."""
        if self.on_gpu:
            model.cuda(self.target())
        return model


def allow_torch_norm_under_sp() -> None:
    """Let megatron-core's `WrappedTorchNorm` be built with `config.sequence_parallel`.

    Its check is bypassed (the config's flag is restored at once) and the norm's parameters are
    marked `sequence_parallel`, so `finalize_model_grads` all-reduces their gradients over the
    tensor-parallel group (each TP rank saw only its share of the tokens). Idempotent."""
    global _NORM_PATCHED
    if _NORM_PATCHED:
        return
    from megatron.core.transformer import torch_norm

    original_new = torch_norm.WrappedTorchNorm.__new__

    def new(cls, config, hidden_size, eps=1e-5, *args, **kwargs):
        if not config.sequence_parallel:
            return original_new(cls, config, hidden_size, eps, *args, **kwargs)
        config.sequence_parallel = False  # the wrapper's check; restored at once
        try:
            norm = original_new(cls, config, hidden_size, eps, *args, **kwargs)
        finally:
            config.sequence_parallel = True
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    torch_norm.WrappedTorchNorm.__new__ = new
    _NORM_PATCHED = True
