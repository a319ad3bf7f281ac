"""How a vLLM engine takes a weight version (generator_svc/engines/served_weights.py), against a
recording stand-in for vLLM's AsyncLLM: model weights load the staged version; a LoRA adapter is
written by the worker and loaded into vLLM's one adapter slot in place, while the requests carry
the slot without `load_inplace` (with it vLLM would reload the adapter from disk at every engine
step); each version's directory replaces the previous one. The real engine runs in
tests/integration/test_recipes.py."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from generator_svc.config import GeneratorSettings, LoraAdapterServing
from generator_svc.engines.served_weights import LoraAdapterWeights, ModelWeights, served_weights
from generator_svc.worker_extension import APPLY, WRITE_ADAPTER


class RecordingLlm:
    def __init__(self, fail_add: bool = False):
        self.calls, self.fail_add = [], fail_add

    async def collective_rpc(self, name, timeout=None, args=()):
        self.calls.append((name, args))
        if name == WRITE_ADAPTER:
            (Path(args[1]) / "adapter_config.json").write_text("{}")
        return [3]

    async def add_lora(self, request):
        self.calls.append(("add_lora", request))
        if self.fail_add:
            raise RuntimeError("vLLM refused the adapter")
        return True


def test_model_weights_apply_the_staged_version():
    llm = RecordingLlm()
    served = served_weights(GeneratorSettings(model_name="m"))
    assert isinstance(served, ModelWeights) and served.streams and served.lora_request is None
    asyncio.run(served.apply(llm, 4))
    assert llm.calls == [(APPLY, (4,))] and served.engine_args() == {}


def test_an_adapter_version_replaces_the_slot_in_place_and_requests_do_not_reload_it(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    served = served_weights(GeneratorSettings(model_name="base", lora_adapters=LoraAdapterServing(rank=4, alpha=8)))
    assert isinstance(served, LoraAdapterWeights) and not served.streams and served.lora_request is None
    assert served.engine_args() == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1, "max_cpu_loras": 1}
    llm = RecordingLlm()
    for version in (1, 2):
        asyncio.run(served.apply(llm, version))
        (write, args), (add, loaded) = llm.calls[-2:]
        assert write == WRITE_ADAPTER and args[0] == version and args[2:] == (4, 8.0, "base")
        assert add == "add_lora" and loaded.load_inplace and loaded.lora_path == args[1]
        request = served.lora_request
        assert request.lora_int_id == loaded.lora_int_id and request.lora_path == loaded.lora_path
        assert not request.load_inplace
    assert [p.name[:8] for p in tmp_path.glob("lora-*")] == ["lora-v2-"]  # v1's directory is gone


def test_a_failed_adapter_load_keeps_the_previous_version_in_the_slot(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    served = LoraAdapterWeights(LoraAdapterServing(rank=8, alpha=16), "base")
    asyncio.run(served.apply(RecordingLlm(), 1))
    before = served.lora_request
    with pytest.raises(RuntimeError, match="refused"):
        asyncio.run(served.apply(RecordingLlm(fail_add=True), 2))
    assert served.lora_request == before and Path(before.lora_path).is_dir()
    assert len(list(tmp_path.glob("lora-*"))) == 1
