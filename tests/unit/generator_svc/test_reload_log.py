"""vLLM's reload warns of layers that loaded nothing; those that load nothing by design (a tied
head, a module holding only buffers kept out of the state dict) are quieted during the reload
(generator_svc/reload_log.py), every other layer's warning stays."""

import importlib.util
import logging
from pathlib import Path

import torch
from torch import nn

from generator_svc.reload_log import NOT_LOADED, RELOAD_LOGGER, quiet_unloaded_by_design, unloaded_by_design


class ParallelLMHead(nn.Module):
    """Named as vLLM's output head, the class the reload's warning names."""


class Gemma3Model(nn.Module):
    """Like vLLM's: the embedding's scale as a buffer kept out of the state dict."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(8, 4)
        self.proj = nn.Linear(4, 4)
        self.register_buffer("normalizer", torch.tensor(2.0), persistent=False)


def model_with_head(tied: bool) -> nn.Module:
    model = nn.Module()
    model.model = Gemma3Model()
    model.lm_head = ParallelLMHead()
    model.lm_head.weight = model.model.embed_tokens.weight if tied else nn.Parameter(torch.zeros(8, 4))
    return model


class Collected(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_warning_is_dropped_for_layers_unloaded_by_design_only_and_only_during_the_block():
    logger, collected = logging.getLogger(RELOAD_LOGGER), Collected()
    logger.addHandler(collected)
    try:
        with quiet_unloaded_by_design(model_with_head(tied=True)) as classes:
            logger.warning(NOT_LOADED, "ParallelLMHead")  # what every publish of a tied model logged
            logger.warning(NOT_LOADED, "Gemma3Model")
            logger.warning(NOT_LOADED, "Linear")
            logger.warning("%s: Excessive loading", "ParallelLMHead")
        logger.warning(NOT_LOADED, "ParallelLMHead")
        with quiet_unloaded_by_design(model_with_head(tied=False)) as untied:
            logger.warning(NOT_LOADED, "ParallelLMHead")
    finally:
        logger.removeHandler(collected)
    assert classes == {"ParallelLMHead", "Gemma3Model"} and untied == {"Gemma3Model"}
    assert collected.messages == ["Linear: Failed to load weights", "ParallelLMHead: Excessive loading",
                                  "ParallelLMHead: Failed to load weights", "ParallelLMHead: Failed to load weights"]


def test_a_class_with_any_module_holding_checkpoint_tensors_stays_reported():
    model = model_with_head(tied=True)
    model.extra_head = ParallelLMHead()
    model.extra_head.weight = nn.Parameter(torch.zeros(8, 4))  # a head with weights of its own
    model.model.register_buffer("scale", torch.tensor(1.0))  # a buffer the state dict carries
    assert unloaded_by_design(model) == frozenset()
    assert unloaded_by_design(nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8))) == frozenset()


def test_vllm_s_reload_still_logs_the_warning_this_quiets():
    """The message and the logger are vLLM 0.32's (read from its source, without importing vLLM)."""
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    source = root.joinpath(*RELOAD_LOGGER.split(".")[1:]).with_suffix(".py").read_text()
    assert "logger = init_logger(__name__)" in source  # the logger is named after the module
    assert f'logger.warning("{NOT_LOADED}", layer.__class__.__name__)' in source
