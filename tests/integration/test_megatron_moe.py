"""Mixture-of-experts on the Megatron backend, on real torchrun ranks (gloo, CPU, fp32) with tiny
random Qwen2-MoE and Mixtral checkpoints built locally (N(0, 0.15) weights: decisive routing):

- converted logits equal HF's at expert parallel 2, and at TP=2 x EP=2 (4 ranks, sequence
  parallel, the experts split over 2 expert-tensor-parallel ranks) loading the conversion cache
  that a 1-rank run made (Megatron's distributed checkpoint reshards the experts);
- EP=2 (2 ranks: DP=2, experts 0-1 on rank 0, 2-3 on rank 1, fused SwiGLU) trains exactly like
  EP=1 (1 rank, plain SwiGLU), load-balancing loss metric included; with zero advantages the routers' loss is the step's
  only gradient, the same at both layouts (its normalisation does not depend on them), and
  none at all with the balancing off;
- the export gathers every expert to rank 0 bit for bit, and freeze_moe_router keeps every
  router's weights while the experts train (Mixtral, with the alltoall token dispatcher);
- router replay (both EP=2 layouts and TP=2 x EP=2 with sequence parallel): routes fed with
  the samples, as a generator returns them, are the experts every rank's routers use; replaying
  the model's own routes changes no logprob, and moving some routes changes exactly those rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coordinator.embedded.tiny_moe import TinyMoeSpec, ensure_tiny_moe
from tests.integration.test_megatron_backend import run_worker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("moe-models")
    return {family: str(ensure_tiny_moe(root, TinyMoeSpec(family=family, init_std=0.15)))
            for family in ("qwen2_moe", "mixtral")}


def moe(model_dir: str, **cfg) -> dict:
    return {"model_name": model_dir, "megatron_cfg": {"enabled": True, **cfg}}


REPLAY = {"router_replay": {"enabled": True}}


AUX = {"moe_router_load_balancing_type": "aux_loss"}
STEP_KEYS = ("loss", "grad_norm", "kl", "entropy", "moe_load_balancing_loss")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("moe-cache")


@pytest.fixture(scope="module")
def ep1(models, tmp_path_factory, shared_cache) -> dict:
    """The reference: the Qwen2-MoE on one rank (every expert local), converted into shared_cache."""
    out = run_worker(tmp_path_factory.mktemp("moe-ep1"), moe(models["qwen2_moe"], **AUX), "moe", 1, shared_cache)[0]
    assert out["logits"]["conversion"] == "converted"
    return out


def _check_common(out: dict) -> None:
    assert out["logits"]["max_abs_diff"] < 1e-4 and out["logits"]["max_abs_logit"] > 1.0, out["logits"]
    assert out["export"]["names_equal"] and not out["export"]["missing_from_source"]
    assert out["export"]["max_abs_diff"] == 0.0  # every expert gathered to rank 0 bit for bit


@pytest.fixture(scope="module")
def ep2(models, tmp_path_factory) -> dict[str, dict]:
    """The two EP=2 layouts, one after another in one 2-rank launch: the Qwen2-MoE with
    bias_activation_fusion (Megatron's jit-scripted SwiGLU, which runs on CPU, against ep1's plain
    SwiGLU), and the Mixtral with frozen routers and the all-to-all token dispatcher."""
    tmp = tmp_path_factory.mktemp("moe-ep2")
    layouts = {"qwen2_moe": {**moe(models["qwen2_moe"], expert_model_parallel_size=2, bias_activation_fusion=True,
                                   **AUX), **REPLAY},
               "mixtral": {**moe(models["mixtral"], expert_model_parallel_size=2, freeze_moe_router=True,
                                 moe_token_dispatcher_type="alltoall"), **REPLAY}}
    return dict(zip(layouts, run_worker(tmp, list(layouts.values()), "moe", 2, tmp / "c")[0]))


def test_ep2_equals_hf_and_trains_like_ep1(ep1, ep2):
    ep2 = ep2["qwen2_moe"]
    _check_common(ep1)
    _check_common(ep2)  # measured: 5.6e-6 (logits up to 6.5)
    assert ep2["logits"]["conversion"] == "converted"  # its own cache: converted at EP=2
    for mine, ref in zip(ep2["steps"], ep1["steps"]):
        for key in STEP_KEYS:
            assert abs(mine[key] - ref[key]) < 1e-4, (key, mine, ref)
    assert ep1["steps"][0]["moe_load_balancing_loss"] > 1.0  # E * sum(f * P) >= 1, = 1 when perfectly balanced
    for row, ref_row in zip(ep2["logprobs"], ep1["logprobs"]):
        assert max(abs(a - b) for a, b in zip(row, ref_row)) < 1e-4
    # the routers' loss alone moves the weights, by the same gradient at both layouts
    aux1, aux2 = ep1["auxgrad"]["grad_norm"], ep2["auxgrad"]["grad_norm"]
    assert aux1 > 1e-4 and abs(aux2 - aux1) < 1e-4 * aux1, (aux1, aux2)


def test_tp2_x_ep2_equals_hf_and_trains_like_ep1(ep1, models, tmp_path, shared_cache):
    layout = dict(tensor_model_parallel_size=2, expert_model_parallel_size=2, sequence_parallel=True)
    four, _ = run_worker(tmp_path, {**moe(models["qwen2_moe"], **layout, **AUX), **REPLAY}, "moe", 4, shared_cache)
    _check_common(four)  # the experts also split over 2 expert-tensor-parallel ranks
    _check_replay(four["replay"], ranks=4)  # each TP rank's routers take its half of the sequence
    assert four["logits"]["conversion"] == "cached"  # the EP=1 conversion, resharded to TP=2 x EP=2 x ETP=2
    for mine, ref in zip(four["steps"], ep1["steps"]):
        assert abs(mine["loss"] - ref["loss"]) < 1e-4 and abs(mine["kl"] - ref["kl"]) < 1e-4
        # sequence parallel pads each row to an even width, and padding tokens are routed too, so
        # the routers' loss (and its share of the gradient) moves a little: measured 3.6e-3 / 3.4e-4
        assert abs(mine["moe_load_balancing_loss"] - ref["moe_load_balancing_loss"]) < 2e-2
        assert abs(mine["grad_norm"] - ref["grad_norm"]) < 5e-3 * ref["grad_norm"]


def test_mixtral_with_frozen_routers_no_balancing_loss_and_alltoall(ep2):
    out = ep2["mixtral"]
    _check_common(out)
    assert out["auxgrad"]["grad_norm"] == 0.0 and "moe_load_balancing_loss" not in out["auxgrad"]
    routers = [n for n in out["names"] if n.endswith("block_sparse_moe.gate.weight")]
    experts = [n for n in out["names"] if ".experts." in n]
    assert len(routers) == 2 and not set(routers) & set(out["moved"])  # frozen: not one weight moved
    moved_experts = {int(n.split(".experts.")[1].split(".")[0]) for n in out["moved"] if ".experts." in n}
    assert len(experts) == 2 * 4 * 3 and moved_experts & {0, 1} and moved_experts & {2, 3}  # on both EP ranks


def _check_replay(out: dict, ranks: int) -> None:
    """job_replay's results (tests/megatron/worker.py)."""
    assert len(out["used_by_rank"]) == ranks and all(r["equal"] and r["rows"] > 0 for r in out["used_by_rank"])
    assert out["own"] == out["plain"]  # the model's own routes, replayed: not one logprob moves
    assert max(abs(a - b) for x, y in zip(out["other"], out["plain"]) for a, b in zip(x, y)) > 1e-2
    own, other = out["own_step"], out["other_step"]
    assert own["moe_router_replay_rows"] == other["moe_router_replay_rows"] == out["given_rows"]
    assert own["moe_router_replay_disagreement"] == 0.0
    assert other["moe_router_replay_disagreement"] == out["moved_rows"] / out["given_rows"]  # those rows, no more
    assert math.isfinite(out["trained_step"]["grad_norm"]) and out["trained_step"]["grad_norm"] > 0


def test_router_replay_routes_by_the_fed_experts(ep2):
    for family in ("qwen2_moe", "mixtral"):
        _check_replay(ep2[family]["replay"], ranks=2)
