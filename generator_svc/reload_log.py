"""Quiet vLLM's false alarm about layers that a weight version never carries.

vLLM 0.32's layerwise reload (`model_runner.reload_weights`, vllm/model_executor/model_loader/
reload/layerwise.py) warns "<layer class>: Failed to load weights" for every layer that holds
tensors and received none, then puts the layer's old tensors back. Some layers receive none by
design, at every publish of every run:
- a tied output head (`lm_head` of Qwen2.5-0.5B/1.5B, Llama 3.2 1B/3B): its weight is the
  embedding's Parameter, reloaded in place through the embedding (generator_svc/tied_weights.py
  then re-derives the head's packed CPU copy);
- a module whose only own tensors are buffers kept out of the state dict (Gemma3Model's
  `normalizer`), which no checkpoint carries.

`quiet_unloaded_by_design` drops that one warning, for the length of a reload, for the classes all
of whose modules are such layers (`unloaded_by_design`); any other layer that loads nothing is still
reported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
"""The logger of vLLM's layerwise reload (named after its module)."""
NOT_LOADED = "%s: Failed to load weights"
"""Its warning for a layer that received no tensors, formatted with the layer's class name."""


def unloaded_by_design(model: nn.Module) -> frozenset[str]:
    """Class names each of whose modules that hold tensors of their own hold only parameters a
    module before them holds (tied) and buffers kept out of the state dict; a class with any module
    holding a tensor a checkpoint carries is left out, so its load failures stay visible."""
    seen: set[int] = set()
    by_design: set[str] = set()
    carried: set[str] = set()
    for module in model.modules():
        params = [id(p) for p in module.parameters(recurse=False)]
        persistent = [name for name in module._buffers if name not in module._non_persistent_buffers_set]
        if params or module._buffers:
            owns = persistent or any(p not in seen for p in params)
            (carried if owns else by_design).add(type(module).__name__)
        seen.update(params)
    return frozenset(by_design - carried)


class _DropNotLoaded(logging.Filter):
    def __init__(self, classes: frozenset[str]):
        super().__init__()
        self.classes = classes

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == NOT_LOADED and isinstance(record.args, tuple) and record.args
                    and record.args[0] in self.classes)


@contextmanager
def quiet_unloaded_by_design(model: nn.Module) -> Iterator[frozenset[str]]:
    """Within the block, the reload's "Failed to load weights" warning is dropped for the classes
    of `unloaded_by_design(model)` (yielded); with none, nothing changes."""
    classes = unloaded_by_design(model)
    if not classes:
        yield classes
        return
    quiet, logger = _DropNotLoaded(classes), logging.getLogger(RELOAD_LOGGER)
    logger.addFilter(quiet)
    try:
        yield classes
    finally:
        logger.removeFilter(quiet)
