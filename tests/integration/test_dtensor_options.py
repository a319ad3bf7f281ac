"""DTensor backend options under real torchrun (2 CPU ranks, gloo): each option trains the same
batches as the plain FSDP2 layout and must give the same logprobs, losses and grad norms.

The variants of all three tests run in one torchrun world (benchmarks/backend_variants.py, a
module fixture), one after another: one launch instead of three (~10 s of start-up each in a
full test run).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5


def _build_tiny_llama(out_dir: Path, vocab_size: int = 64) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def run_variants(tmp_path: Path, spec: dict, nproc: int = 2) -> dict:
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps(spec))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", str(nproc),
                           str(ROOT / "benchmarks" / "backend_variants.py"), str(spec_path), str(out_path)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out_path.read_text())


def max_logprob_error(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(max(abs(x - y) for x, y in zip(ra, rb)) for ra, rb in zip(a, b))


def assert_same_run(result: dict, reference: dict, tol: float = TOL) -> None:
    assert max_logprob_error(result["logprobs"], reference["logprobs"]) < tol
    for key in ("losses", "grad_norms"):
        assert result[key] == pytest.approx(reference[key], abs=tol, rel=0), key
    assert max_logprob_error(result["logprobs_after"], reference["logprobs_after"]) < 10 * tol
    # the gathered HF state dict (what publish and export send) holds the same trained weights
    assert result["state_sums"].keys() == reference["state_sums"].keys()
    for name, total in reference["state_sums"].items():
        assert result["state_sums"][name] == pytest.approx(total, abs=1e-3), name


PACKED = {"enabled": True, "train_mb_tokens": 64, "logprob_mb_tokens": 96}
TP2 = {"tensor_parallel_size": 2}
JOBS = {
    "packing": {"base": {"seed": 3, "optimizer": {"lr": 1e-3}, "max_grad_norm": 1.0},
                "num_samples": 16, "global_batch_size": 8, "micro_batch_size": 2, "num_steps": 2,
                "loss": {"kind": "grpo", "token_level_loss": False, "reference_policy_kl_penalty": 0.05},
                "variants": {"padded": {},
                             "packed": {"sequence_packing": PACKED},
                             "packed_in_order": {"sequence_packing": {**PACKED, "algorithm": "concatenative"}}}},
    "parallel": {"base": {"seed": 5, "optimizer": {"lr": 1e-3}, "max_grad_norm": 0.5},
                 "num_samples": 8, "global_batch_size": 4, "micro_batch_size": 2, "num_steps": 3,
                 "loss": {"kind": "grpo", "reference_policy_kl_penalty": 0.05},
                 "variants": {"fsdp": {},
                              "tp2": {"dtensor_cfg": TP2},
                              "tp2_sp": {"dtensor_cfg": {**TP2, "sequence_parallel": True}},
                              "tp2_sp_packed_ac": {"dtensor_cfg": {**TP2, "sequence_parallel": True,
                                                                   "activation_checkpointing": True},
                                                   "sequence_packing": PACKED}}},
    "offload": {"base": {"seed": 7, "optimizer": {"lr": 1e-3}, "max_grad_norm": 1.0},
                "num_samples": 8, "global_batch_size": 4, "micro_batch_size": 2, "num_steps": 2,
                "loss": {"kind": "nll"},
                "variants": {"fp32": {},
                             "offload": {"dtensor_cfg": {"cpu_offload": True}},
                             "offload_tp2": {"dtensor_cfg": {"cpu_offload": True, "tensor_parallel_size": 2}},
                             "bf16": {"dtype": "bfloat16"}}},
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    """Every job's results, {job: {variant: results}}, from one launch."""
    root = tmp_path_factory.mktemp("dtensor-options")
    model_dir = str(_build_tiny_llama(root / "tiny"))
    spec = {"jobs": {job: {"model_dir": model_dir, **job_spec} for job, job_spec in JOBS.items()}}
    spec["jobs"]["parallel"]["checkpoint_dir"] = str(root / "ckpt")
    return run_variants(root, spec)


def test_sequence_packing_matches_padded_batches(jobs):
    results = jobs["packing"]
    reference = results["padded"]
    assert all(abs(x) > 0 for x in reference["losses"])  # the comparison means something
    for name in ("packed", "packed_in_order"):
        assert_same_run(results[name], reference)


def test_tensor_and_sequence_parallel_match_fsdp(jobs):
    results = jobs["parallel"]
    reference = results["fsdp"]
    assert max(reference["grad_norms"]) > 0.5  # clipping is active in the compared steps
    assert reference["layout"] == ["dp:Shard(dim=0)"]
    for name, result in results.items():  # a DCP checkpoint restores the exact state under every layout
        first, again = result["resume_losses"]
        assert again == pytest.approx(first, abs=1e-6), name
    for name in ("tp2", "tp2_sp", "tp2_sp_packed_ac"):  # q/k/v, gate/up, lm_head rows and o/down columns split over tp
        assert {"dp,tp:Shard(dim=0),Shard(dim=1)", "dp,tp:_StridedShard(dim=0, sf=2),Shard(dim=0)"} <= set(
            results[name]["layout"]), results[name]["layout"]
        assert_same_run(results[name], reference)


def test_cpu_offload_and_bf16_with_fp32_master_weights(jobs):
    results = jobs["offload"]
    reference = results["fp32"]
    for name in ("offload", "offload_tp2"):  # on CPU the offload moves nothing: exactly the same run
        assert_same_run(results[name], reference)
    bf16 = results["bf16"]
    assert bf16["param_dtypes"] == ["torch.float32"]  # fp32 master weights, bf16 compute
    assert bf16["losses"] == pytest.approx(reference["losses"], rel=2e-2)
    assert bf16["losses"] != reference["losses"]  # the compute really ran in bf16
    assert bf16["losses"][1] < bf16["losses"][0]
