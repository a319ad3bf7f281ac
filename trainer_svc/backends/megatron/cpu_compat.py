"""CPU compatibility layer for megatron-core (0.16.x) over gloo: used only when torch has no
CUDA device; on GPUs `install()` does nothing and `active()` is a null context.

megatron-core assumes CUDA in a handful of places. Each patch below, and why:

1. RNG tracker. `CudaRNGStatesTracker.add` reads `torch.cuda.get_rng_state()` (reached from
   `model_parallel_cuda_manual_seed`) and every attention forward enters `tracker.fork()`.
   A tracker subclass keeps its named states as CPU generator states, and the module's
   `_get_cuda_rng_state` / `_set_cuda_rng_state` (used by activation recomputation to replay
   dropout) read and write the CPU generator.
2. `torch.cuda.current_device()` is used as a device argument (rotary `inv_freq`, the global
   memory buffer of attention, TP communication buffers): it returns "cpu".
3. Tensors created with `device="cuda"` (the schedules' token counters, optimizer and
   grad-scaler scalars, clip-grad norms) and `Tensor.cuda()`: a `TorchFunctionMode` rewrites
   CUDA devices to CPU and makes `.cuda()` return the tensor. The mode is thread-local, so
   `active()` wraps every backend call (the gRPC server runs the engine in a worker thread).
   The default causal mask (`device="cuda"`) is also built during activation recomputation,
   inside autograd's backward where the mode is not active: `get_default_causal_mask` is
   replaced (in `transformer.utils` and in `fused_softmax`, which imported it by name).
4. dtype checks written as `tensor.type() == 'torch.cuda.FloatTensor'` (optimizer setup,
   distributed optimizer, clip-grad's zero counter): under the mode `Tensor.type()` with no
   argument reports the CUDA type name of the tensor's dtype.
5. `torch.cuda.synchronize`, `current_stream`, `default_stream`, `Stream`, `stream` (p2p
   communication, DDP buckets, the MoE alltoall dispatcher's device-to-host event): no-ops and
   null objects (CPU work is synchronous).
6. gloo `scatter` with non-contiguous inputs silently sends wrong data (torch 2.13; seen as
   wrong TP=2 weights after a scatter of `torch.chunk(x, 2, dim=1)` slices): a wrapper makes
   every tensor of the scatter list contiguous.
7. Sequence parallelism: `WrappedTorchNorm` refuses `config.sequence_parallel`. torch's norm is
   correct under SP (it normalises each token), provided its weights are marked
   `sequence_parallel` so `finalize_model_grads` all-reduces their gradients over TP: the
   wrapper builds the norm without the check and marks its parameters. The same patch is
   needed on GPUs with the local spec (placement.py installs it there too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from trainer_svc.backends.megatron.placement import allow_torch_norm_under_sp

_INSTALLED = False
_CUDA_TYPE_NAMES = {torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
                    torch.bfloat16: "torch.cuda.BFloat16Tensor", torch.int64: "torch.cuda.LongTensor",
                    torch.int32: "torch.cuda.IntTensor", torch.uint8: "torch.cuda.ByteTensor",
                    torch.bool: "torch.cuda.BoolTensor"}


def needed() -> bool:
    """True when the patches apply: this torch has no usable CUDA device."""
    return not torch.cuda.is_available()


def install() -> None:
    """Apply patches 1, 2 and 5-8 (process-wide, idempotent); patch 3-4 come with `active()`."""
    global _INSTALLED
    if _INSTALLED or not needed():
        return
    _patch_rng()
    _patch_cuda_runtime()
    _patch_scatter()
    allow_torch_norm_under_sp()
    _patch_causal_mask()
    _patch_all_to_all_splits()
    _INSTALLED = True


@contextlib.contextmanager
def active() -> Iterator[None]:
    """Within the block (this thread), CUDA tensor creation lands on the CPU (patches 3-4)."""
    if not needed():
        yield
        return
    install()
    with _CudaToCpu():
        yield


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _CUDA_TYPE_NAMES.get(args[0].dtype, func(*args))
        device = kwargs.get("device")
        if device is not None and _is_cuda(device):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to:
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


def _patch_rng() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRngStatesTracker(mrandom.CudaRNGStatesTracker):
        """Named CPU generator states (patch 1)."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_ or name in self.states_:
                raise ValueError(f"rng state {name!r} or seed {seed} is already tracked")
            self.seeds_.add(seed)
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise KeyError(f"rng state {name!r} is not tracked")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    mrandom._CUDA_RNG_STATE_TRACKER = CpuRngStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mrandom._get_cuda_rng_state = lambda *args, clone=False, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    torch.cuda.manual_seed = torch.manual_seed


class _NullStream:
    """Stands in for torch.cuda.Stream (patch 5); must stay a class for `Stream | None` annotations."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, *args, **kwargs) -> _NullEvent:
        return _NullEvent()


class _NullEvent:
    """What a null stream's `record_event` returns (the MoE alltoall dispatcher synchronizes on it)."""

    def synchronize(self) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def query(self) -> bool:
        return True


def _patch_cuda_runtime() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.Stream = _NullStream
    torch.cuda.current_stream = torch.cuda.default_stream = lambda *args, **kwargs: _NullStream()
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()


def _patch_scatter() -> None:
    original = dist.scatter

    def scatter_contiguous(tensor, scatter_list=None, *args, **kwargs):
        if scatter_list:
            scatter_list = [t.contiguous() for t in scatter_list]
        return original(tensor, scatter_list, *args, **kwargs)

    dist.scatter = scatter_contiguous


def _patch_all_to_all_splits() -> None:
    original = dist.all_to_all_single

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        def as_list(sizes):
            return None if sizes is None else [int(n) for n in sizes]

        return original(output, input, as_list(output_split_sizes), as_list(input_split_sizes), *args, **kwargs)

    dist.all_to_all_single = all_to_all_single


def _patch_causal_mask() -> None:
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    utils.get_default_causal_mask = fused_softmax.get_default_causal_mask = causal_mask
