"""A CPU generator's reload runs on one thread fewer while a streamed update arrives
(generator_svc/receive_threads.py), also inside vLLM's CPU worker, where torch.set_num_threads
is a no-op."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from generator_svc.receive_threads import UNPINNED, receive_threads, threads_while_receiving

CPU = torch.device("cpu")
UNPINNED_ENV = {"VLLM_CPU_OMP_THREADS_BIND": UNPINNED}


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_core_is_left_to_the_wire_and_never_the_last():
    assert [receive_threads(n) for n in (1, 2, 3, 8)] == [1, 1, 2, 7]


def test_the_count_drops_inside_and_comes_back_after_success_and_failure(two_threads):
    with threads_while_receiving(CPU, UNPINNED_ENV) as threads:
        assert threads == torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ConnectionError), threads_while_receiving(CPU, UNPINNED_ENV):
        assert torch.get_num_threads() == 1
        raise ConnectionError("the transfer failed part-way")
    assert torch.get_num_threads() == 2


def test_it_works_where_vllm_made_torch_set_num_threads_a_no_op(two_threads, monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # as vLLM's CPU worker does
    with threads_while_receiving(CPU, UNPINNED_ENV) as threads:
        assert threads == torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("device", "environ"), [
    (CPU, {}),  # vLLM's own default ("auto") pins its threads
    (CPU, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),  # cpu_threads_bind
    (torch.device("cuda"), UNPINNED_ENV),  # the reload's work is on the device
])
def test_pinned_threads_and_gpus_keep_their_count(two_threads, device, environ):
    with threads_while_receiving(device, environ) as threads:
        assert threads == torch.get_num_threads() == 2


def test_vllm_s_cpu_worker_still_disables_torch_set_num_threads():
    """What the bypass is for; if vLLM stops doing it, torch.set_num_threads would do (the
    source is read, not imported: importing vLLM takes most of a minute)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    source = (Path(next(iter(spec.submodule_search_locations))) / "v1" / "worker" / "cpu_worker.py").read_text()
    assert "torch.set_num_threads = skip_set_num_threads" in source
