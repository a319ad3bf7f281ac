"""MoE router replay's plumbing without Megatron: routes from vLLM's output to the completion, over
the generator's and the trainer's wire, into a sample; their shape checks; the [B, T, layers, k]
tensor of a micro-batch and each layer's target in the order Megatron's router flattens tokens
(sequence-major, a TP rank's share under sequence parallelism); and the config checks at load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from coordinator.config import ConfigError, load_config
from coordinator.launch.specs import generator_settings, trainer_settings
from coordinator.loop.groups import RolloutGroups
from coordinator.loop.multiturn import Episode
from generator_svc.engines.vllm_outputs import flat_routes, to_completion
from tandem.generation.convert import completion_from_pb, completion_to_pb
from tandem.generation.types import Completion
from trainer_svc.client import _sample_pb
from trainer_svc.config import TrainerSettings
from trainer_svc.routes import NOT_ROUTED, num_route_rows, router_targets, routes_BTLK
from trainer_svc.server import _sample
from trainer_svc.types import Sample


class _Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


class _Output:
    def __init__(self, token_ids, routed_experts):
        self.token_ids, self.finish_reason, self.routed_experts = token_ids, "stop", routed_experts
        self.logprobs = [{t: _Logprob(-1.0)} for t in token_ids]


def test_vllm_routes_become_the_completion_s_and_survive_the_wire():
    routes = np.arange(4 * 2 * 2, dtype=np.uint8).reshape(4, 2, 2) % 4  # vLLM: [positions, layers, k], uint8
    completion = to_completion(_Output([7, 8], routes), 0, 0, current_version=1)
    assert completion.routed_experts == tuple(int(x) for x in routes.flatten())
    assert to_completion(_Output([7, 8], None), 0, 0, current_version=1).routed_experts == ()
    assert flat_routes(None) == ()
    assert completion_from_pb(completion_to_pb(completion)) == completion
    plain = Completion(prompt_index=0, sample_index=0, token_ids=(1,), logprobs=(-1.0,), finish_reason="stop",
                       weight_version=0)
    assert completion_from_pb(completion_to_pb(plain)).routed_experts == ()


def test_episode_and_sample_carry_the_last_turn_s_routes_to_the_trainer_wire():
    first = Completion(prompt_index=0, sample_index=0, token_ids=(5, 6), logprobs=(-1.0, -1.0), finish_reason="stop",
                       weight_version=0, routed_experts=(1, 2) * 4)
    later = Completion(prompt_index=0, sample_index=0, token_ids=(9,), logprobs=(-1.0,), finish_reason="stop",
                       weight_version=0, routed_experts=(3, 0) * 6)
    episode = Episode("t")
    episode.add_turn(first)
    episode.add_observation([4])
    episode.add_turn(later)  # prompt + first turn + observation was the later turn's prompt
    assert episode.routed_experts == later.routed_experts
    groups = RolloutGroups([None], [[1, 2]], [[episode]], torch.zeros(1, 1), torch.zeros(1, 1))
    (sample,) = groups.samples()
    assert tuple(sample.routed_experts) == later.routed_experts
    assert _sample(_sample_pb(sample)).routed_experts == later.routed_experts
    bare = Sample((1, 2, 3), 1)
    assert _sample(_sample_pb(bare)).routed_experts is None


def test_route_rows_are_checked_against_the_model_and_the_sample():
    assert num_route_rows([0] * 12, num_layers=2, topk=2, num_tokens=4) == 3
    with pytest.raises(ValueError, match="not a multiple of MoE layers x top-k = 2 x 2"):
        num_route_rows([0] * 10, num_layers=2, topk=2, num_tokens=4)
    with pytest.raises(ValueError, match="5 rows for a sample of 4 tokens"):
        num_route_rows([0] * 20, num_layers=2, topk=2, num_tokens=4)
    with pytest.raises(ValueError, match="experts 0..3"):
        routes_BTLK([Sample((1, 2, 3), 1, routed_experts=[0, 4] * 2)], 4, num_layers=1, topk=2, num_experts=4)


def test_micro_batch_routes_pad_with_not_routed_and_flatten_sequence_major():
    a = Sample((1, 2, 3, 4), 1, routed_experts=list(range(3 * 2 * 2)))  # 3 rows: every token but the last
    b = Sample((1, 2), 1)  # no routes: its rows are the router's own
    routes = routes_BTLK([a, b], width=6, num_layers=2, topk=2, num_experts=12)
    assert routes.shape == (2, 6, 2, 2) and routes.dtype == torch.long
    assert routes[0, :3].flatten().tolist() == list(range(12))
    assert (routes[0, 3:] == NOT_ROUTED).all() and (routes[1] == NOT_ROUTED).all()
    assert routes_BTLK([b, b], 6, 2, 2, 12) is None
    targets = router_targets(routes)
    assert len(targets) == 2 and targets[0].shape == (6 * 2, 2)
    for t in range(6):  # Megatron's router input is [T, B, H] flattened: token (t, b) is row t * B + b
        for b_ in range(2):
            assert torch.equal(targets[1][t * 2 + b_], routes[b_, t, 1])
    halves = [router_targets(routes, tp_rank=r, tp_size=2, sequence_parallel=True) for r in range(2)]
    assert torch.equal(torch.cat([halves[0][0], halves[1][0]]), targets[0])  # each TP rank its contiguous half
    with pytest.raises(ValueError, match="multiple of TP=4"):
        router_targets(routes, tp_rank=0, tp_size=4, sequence_parallel=True)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("moe")
    (path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    return str(path)


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dense")
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return str(path)


MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]


def test_router_replay_is_refused_at_load_where_it_cannot_run(moe_dir, dense_dir):
    replay = "policy.router_replay.enabled=true"
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model.*'qwen2' checkpoint"):
        load_config(overrides=[*MEGATRON, replay, f"policy.model_name={dense_dir}", "cluster.gpus_per_node=1"])
    embedded = load_config(overrides=[*MEGATRON, replay])  # the model is known at launch: the embedded one is dense
    with pytest.raises(ValidationError, match="needs a mixture-of-experts model.*'qwen2' checkpoint"):
        trainer_settings(embedded, dense_dir)
    with pytest.raises(ConfigError, match=r"Megatron backend's forward: set policy\.megatron_cfg\.enabled=true"):
        load_config(overrides=[replay, f"policy.model_name={moe_dir}", "cluster.gpus_per_node=1"])
    in_flight = ["grpo.async_grpo.enabled=true", "grpo.async_grpo.in_flight_weight_updates=true"]
    with pytest.raises(ConfigError, match="recompute_kv_cache_after_weight_updates=true"):  # vLLM's routes need it
        load_config(overrides=[*MEGATRON, replay, f"policy.model_name={moe_dir}", "cluster.gpus_per_node=1", *in_flight])
    load_config(overrides=[*MEGATRON, replay, f"policy.model_name={moe_dir}", *in_flight])  # CPU: Tandem's capture
    with pytest.raises(ValidationError, match="needs a mixture-of-experts model"):
        TrainerSettings(model_name=dense_dir, megatron_cfg={"enabled": True}, dtensor_cfg={"enabled": False},
                        router_replay={"enabled": True})


def test_router_replay_reaches_the_trainer_and_the_generators(moe_dir):
    scratch = Path("/tmp/tg")  # checked for length only (vLLM's socket paths)
    cfg = load_config(overrides=[*MEGATRON, "policy.router_replay.enabled=true", f"policy.model_name={moe_dir}",
                                 "cluster.gpus_per_node=1"])
    assert trainer_settings(cfg, moe_dir).router_replay.enabled
    assert generator_settings(cfg, moe_dir, 0, scratch).return_routed_experts
    off = load_config(overrides=[*MEGATRON, f"policy.model_name={moe_dir}"])
    assert not trainer_settings(off, moe_dir).router_replay.enabled
    assert not generator_settings(off, moe_dir, 0, scratch).return_routed_experts


def test_cpu_capture_splits_each_forward_by_request_at_its_positions():
    """generator_svc/route_capture.py without vLLM: two forwards of a batch of two requests (one a
    child sample of a parallel-sampling request), rows written where each request stood."""
    from types import SimpleNamespace

    from generator_svc.route_capture import RouteCapture, _sample_index

    assert _sample_index("req-3-0-abcdef12", "req-3-0") == 0
    assert _sample_index("2_req-3-0-abcdef12", "req-3-0") == 2
    assert _sample_index("req-3-1-abcdef12", "req-3-0") is None and _sample_index("req-3-0", "req-3-0") is None
    capture = RouteCapture.__new__(RouteCapture)
    batch = SimpleNamespace(req_ids=["0_a-11111111", "b-22222222"], num_computed_tokens_cpu=np.array([0, 0]))
    capture._runner, capture._num_layers, capture._max_len, capture._routes = SimpleNamespace(input_batch=batch), 2, 8, {}
    rows = torch.arange(5 * 2).view(5, 2)  # prefill: 3 tokens of the first request, 2 of the second
    capture._step = {0: rows, 1: rows + 100}
    capture._split(SimpleNamespace(num_scheduled_tokens={"0_a-11111111": 3, "b-22222222": 2}))
    batch.num_computed_tokens_cpu = np.array([3, 2])
    capture._step = {0: torch.tensor([[7, 8], [9, 10]]), 1: torch.tensor([[1, 2], [3, 4]])}  # one decode step each
    capture._split(SimpleNamespace(num_scheduled_tokens={"0_a-11111111": 1, "b-22222222": 1}))
    a = torch.tensor(capture.take("a")[0]).view(-1, 2, 2)
    assert a.shape[0] == 4 and a[:3, 0].tolist() == rows[:3].tolist() and a[3].tolist() == [[7, 8], [1, 2]]
    b = torch.tensor(capture.take("b")[0]).view(-1, 2, 2)
    assert b[:2, 1].tolist() == (rows[3:] + 100).tolist() and b[2].tolist() == [[9, 10], [3, 4]]
    assert capture.take("a") == {} and not capture._routes  # taken once, then forgotten
