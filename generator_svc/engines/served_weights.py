"""What a weight version changes in a vLLM engine, chosen once when the engine starts:

    ModelWeights         the model's own weights (the default): a staged version is loaded
                         into the engine's layers (worker_extension.APPLY), or streamed in
    LoraAdapterWeights   a LoRA adapter over base weights that never change
                         (GeneratorSettings.lora_adapters): a staged version is written as a
                         PEFT directory (worker_extension.WRITE_ADAPTER) and loaded by vLLM's
                         LoRA manager in place of the previous one; every request then runs
                         with it

Both are called with generation paused (VllmEngine._apply). Before the first version arrives
the LoRA engine serves requests without an adapter: the base model, which is what adapters
initialised with B = 0 compute.

One adapter slot, replaced in place (vLLM's `load_inplace`): vLLM loads the new adapter before
it drops the old one, so a load that fails leaves the previous version in the slot. The
requests carry the slot's request without `load_inplace`, or vLLM would reload the adapter from
disk at every engine step they are scheduled in.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from generator_svc.config import GeneratorSettings, LoraAdapterServing
from generator_svc.worker_extension import APPLY, WRITE_ADAPTER

ADAPTER_NAME = "tandem-policy"
ADAPTER_ID = 1


class ServedWeights(Protocol):
    streams: bool
    """Whether a version may be loaded bucket by bucket as it arrives (worker_extension.RECEIVE_APPLY)."""

    @property
    def lora_request(self) -> Any:
        """What every generate and score request is sent with (vLLM's LoRARequest), or None."""

    def engine_args(self) -> dict[str, Any]:
        """vLLM engine arguments this needs."""

    async def apply(self, llm: Any, version: int) -> None:
        """Make the staged `version` the one served (generation is paused); raises on failure."""


class ModelWeights:
    streams = True
    lora_request = None

    def engine_args(self) -> dict[str, Any]:
        return {}

    async def apply(self, llm: Any, version: int) -> None:
        await llm.collective_rpc(APPLY, args=(version,))


class LoraAdapterWeights:
    streams = False  # an adapter is small: staged whole, then written and loaded

    def __init__(self, serving: LoraAdapterServing, base_model: str) -> None:
        self._serving, self._base_model = serving, base_model
        self._request: Any = None
        self._directory: Path | None = None

    @property
    def lora_request(self) -> Any:
        return self._request

    def engine_args(self) -> dict[str, Any]:
        return {"enable_lora": True, "max_lora_rank": self._serving.max_lora_rank, "max_loras": 1, "max_cpu_loras": 1}

    async def apply(self, llm: Any, version: int) -> None:
        from vllm.lora.request import LoRARequest

        directory = Path(tempfile.mkdtemp(prefix=f"lora-v{version}-"))  # under the process's own scratch (TMPDIR)
        try:
            await llm.collective_rpc(WRITE_ADAPTER, args=(version, str(directory), self._serving.rank,
                                                          self._serving.alpha, self._base_model))
            await llm.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(directory), load_inplace=True))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        previous, self._directory = self._directory, directory
        self._request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(directory))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)


def served_weights(settings: GeneratorSettings) -> ServedWeights:
    """The engine's kind of weight version, from its settings."""
    if settings.lora_adapters is None:
        return ModelWeights()
    return LoraAdapterWeights(settings.lora_adapters, settings.model_name)
