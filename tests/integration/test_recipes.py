"""Every recipe in examples/configs/ a few steps end to end on the embedded tiny model, with
real services on 127.0.0.1, exactly as `tandem run RECIPE` runs it (only sizes shortened):

- dpo.yaml: reward accuracy on the toy pairs rises from 0 (policy = reference: every pair ties)
  in training and on held-out pairs;
- rm.yaml: Bradley-Terry accuracy rises, and the exported HF checkpoint, served by a real
  reward_svc process, scores held-out chosen responses above rejected ones;
- grpo.yaml and sft.yaml: the SFT warm start / SFT validations and GRPO steps complete;
- dapo.yaml: dynamic sampling drops zero-variance groups and logs its counters. The untrained
  model never gets an exact-match reward (every group would have zero variance), so the task's
  reward here is a Python function (the completion starts with a digit) served by the run;
- grpo_lora.yaml: GRPO training LoRA adapters raises that same reward on the embedded task's
  prompts, on-policy, with lora_cfg.weight_sync: adapter (the generator receives the adapters
  alone and serves them through vLLM's LoRA layers);
- distillation.yaml: an untrained student distilled from a teacher served by its own generator
  service (the embedded model fine-tuned briefly, coordinator/embedded/teacher.py) lowers its
  per-token reverse KL to the teacher, and resumed from its step-4 checkpoint repeats steps 5-8 exactly;
- ppo.yaml: PPO with a critic service raises the reward of an untrained policy while the critic's
  value loss falls, and its checkpoint holds the critic beside the policy.
The MoE recipe (grpo_moe_megatron.yaml) runs in tests/integration/test_moe_grpo.py, on a tiny
MoE checkpoint built there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from coordinator.api import GRPOTrainer
from reward_svc.client import RewardClient
from reward_svc.types import ScoreItem
from tests import procs
from tests.integration import run_files

pytestmark = pytest.mark.integration

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """One TANDEM_HOME for the module: the embedded model and datasets are built once."""
    return tmp_path_factory.mktemp("tandem-home")


def _run(recipe: str | dict, tmp_path: Path, monkeypatch, home: Path, reward_fns=None, **overrides) -> dict:
    monkeypatch.setenv("TANDEM_HOME", str(home))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TANDEM_TOKEN", raising=False)
    short = {"logger.log_dir": str(tmp_path / "runs"), "logger.run_name": recipe, "logger.tensorboard_enabled": False,
             "logger.plot_enabled": False, **overrides}
    config = RECIPES / f"{recipe}.yaml" if isinstance(recipe, str) else recipe
    return GRPOTrainer(config, reward_fns=reward_fns, **short).train()


def _rows(summary: dict, phase: str) -> list[dict]:
    return [row for row in summary["metrics"] if row["phase"] == phase]


def assert_exported_model_generates(summary: dict) -> None:
    """The run's <run>/hf export loads with transformers and generates (every recipe ends with one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = Path(summary["hf"])
    assert export == Path(summary["run_dir"]) / "hf" and not list(export.parent.glob(".hf.partial-*"))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(export), AutoTokenizer.from_pretrained(export)
    ids = tokenizer("12+34=", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_dpo_recipe_raises_reward_accuracy(tmp_path, monkeypatch, home):
    summary = _run("dpo", tmp_path, monkeypatch, home, **{"dpo.max_num_steps": 6, "dpo.val_period": 3,
                                                          "dpo.max_val_samples": 32})
    rows = _rows(summary, "dpo")
    assert len(rows) == 6 and summary["algorithm"] == "dpo"
    assert rows[0]["accuracy"] == 0.0  # policy = reference: every pair ties
    assert min(r["accuracy"] for r in rows[-2:]) >= 0.75, [r["accuracy"] for r in rows]  # measured: 1.0 from step 3
    assert rows[-1]["reward_margin"] > rows[1]["reward_margin"] > 0
    assert summary["val_accuracy_before"] == 0.0 and summary["val_accuracy_after"] >= 0.75
    assert_exported_model_generates(summary)
    assert not list((Path(summary["run_dir"]) / "services").glob("generator-*.json"))  # the trainer alone


def test_rm_recipe_trains_a_reward_model_that_reward_svc_serves(tmp_path, monkeypatch, home):
    summary = _run("rm", tmp_path, monkeypatch, home, **{"rm.max_num_steps": 8})
    rows = _rows(summary, "rm")
    accuracy = [r["accuracy"] for r in rows]
    assert len(rows) == 8 and summary["algorithm"] == "rm"
    assert min(accuracy[-3:]) >= 0.8 and sum(accuracy[-3:]) / 3 > accuracy[0], accuracy  # measured: 0.44 -> 1.0
    assert rows[-1]["loss"] < rows[0]["loss"]

    checkpoint = Path(summary["hf"])
    assert json.loads((checkpoint / "config.json").read_text())["architectures"] == ["LlamaForSequenceClassification"]
    held_out = [json.loads(line) for line in _val_pairs(home).read_text().splitlines()][:40]
    settings = tmp_path / "reward.json"
    settings.write_text(json.dumps({"tasks": {"prefs": "reward_model"}, "reward_model": {"model_name": str(checkpoint)}}))
    service = procs.start(procs.python_module("reward_svc", "--settings", str(settings)), tmp_path, "reward-rm")
    client = RewardClient(service.address, procs.TOKEN)
    try:
        results = client.score([ScoreItem("prefs", p["prompt"], p[key], "")
                                for p in held_out for key in ("chosen", "rejected")])
    finally:
        client.close()
        assert service.stop() == 0, service.log()[-2000:]
    wins = [results[i].reward > results[i + 1].reward for i in range(0, len(results), 2)]
    assert sum(wins) / len(wins) >= 0.8, wins


def _val_pairs(home: Path) -> Path:
    (path,) = (home / "datasets").glob("arithmetic_preference-*/val.jsonl")
    return path


ROLLOUT_SIZES = {"grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4, "grpo.max_val_samples": 16,
                 "policy.train_global_batch_size": 16, "policy.train_micro_batch_size": 16,
                 "checkpointing.enabled": False}


def test_grpo_recipe_warm_starts_then_runs_grpo_steps(tmp_path, monkeypatch, home):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)  # the default (tests/conftest.py shares one cache)
    summary = _run("grpo", tmp_path, monkeypatch, home, **ROLLOUT_SIZES, **{
        "grpo.max_num_steps": 2, "sft.max_num_steps": 10, "sft.val_period": 10})
    assert len(_rows(summary, "sft")) == 1 and summary["sft_steps"] == 10
    grpo = _rows(summary, "grpo")
    assert [r["step"] for r in grpo] == [1, 2] and all(r["num_samples"] == 16 for r in grpo)
    assert summary["accuracy_before"] is not None and summary["accuracy_after"] is not None
    assert_exported_model_generates(summary)
    # vLLM's model-class inspection is cached across runs in the home (else each start imports vLLM once more)
    assert list((home / "vllm" / "vllm-cache" / "modelinfos").iterdir())


def test_sft_recipe_trains_and_validates(tmp_path, monkeypatch, home):
    summary = _run("sft", tmp_path, monkeypatch, home, **{
        "sft.max_num_steps": 20, "sft.val_period": 10, "grpo.max_val_samples": 16})
    sft = _rows(summary, "sft")
    assert [r["sft_steps"] for r in sft] == [10.0, 20.0] and summary["grpo_steps"] == 0
    assert sft[-1]["loss"] < sft[0]["loss"] and "val_accuracy" in sft[-1]
    assert_exported_model_generates(summary)


def starts_with_a_digit(prompt: str, completion: str, answer: str) -> float:
    """Sparse for an untrained model (most completions start with another character), so many
    prompt groups have no reward variance and dynamic sampling must drop them and draw more."""
    return 1.0 if completion[:1].isdigit() else 0.0


def test_dapo_recipe_exercises_dynamic_sampling(tmp_path, monkeypatch, home):
    summary = _run("dapo", tmp_path, monkeypatch, home, reward_fns={"arithmetic": starts_with_a_digit},
                   **ROLLOUT_SIZES, **{"grpo.max_num_steps": 2, "sft.max_num_steps": 0,
                                       "grpo.dynamic_sampling_max_gen_batches": 30, "grpo.val_at_start": False})
    grpo = _rows(summary, "grpo")
    assert len(grpo) == 2
    counters = ("dynamic_sampling_num_gen_batches", "dynamic_sampling_num_zero_variance_groups",
                "dynamic_sampling_num_discarded_valid_samples", "filtered_reward")
    for row in grpo:
        assert all(name in row for name in counters), sorted(row)
        assert row["dynamic_sampling_num_gen_batches"] >= 1 and 0 < row["filtered_reward"] < 1
    assert sum(r["dynamic_sampling_num_zero_variance_groups"] for r in grpo) > 0
    assert [r["step"] for r in _rows(summary, "val")] == [2]  # grpo.val_at_start=false: none at step 0
    logged = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert any("dynamic_sampling_num_zero_variance_groups" in row for row in logged)
    assert_exported_model_generates(summary)


def test_lora_recipe_with_adapter_sync_raises_the_reward(tmp_path, monkeypatch, home):
    """grpo_lora.yaml with lora_cfg.weight_sync: adapter: each publish is the adapters alone (PEFT's
    names, a tenth of the model's bytes), which the generator serves through vLLM's LoRA layers
    over its base weights: every step is on-policy (the generator's logprobs are the trainer's)
    and the reward of the generator's samples rises, so what it serves is the trained adapters.
    (The recipe's default, merged weights, publishes as every full-model run does; its merge is
    checked against PEFT's in tests/integration/test_lora.py and tests/unit/trainer_svc/test_lora_adapter_sync.py.)"""
    summary = _run("grpo_lora", tmp_path, monkeypatch, home, reward_fns={"arithmetic": starts_with_a_digit},
                   **{"grpo.max_num_steps": 8, "grpo.num_prompts_per_step": 8, "grpo.num_generations_per_prompt": 8,
                      "policy.train_global_batch_size": 64, "policy.train_micro_batch_size": 32,
                      "policy.dtensor_cfg.lora_cfg.weight_sync": "adapter",
                      "grpo.val_at_start": False, "grpo.val_period": 0, "checkpointing.enabled": False})
    grpo = _rows(summary, "grpo")
    rewards = [r["reward_mean"] for r in grpo]
    assert len(grpo) == 8 and all(abs(r["token_mult_prob_error"] - 1.0) < 0.01 for r in grpo), grpo
    assert sum(rewards[-4:]) / 4 > rewards[0] + 0.08, rewards  # measured (merged): 0.06 -> 0.19-0.31
    log = Path(summary["run_dir"]) / "logs" / "coordinator.log"
    published = [json.loads(line) for line in log.read_text().splitlines() if '"weights_published"' in line]
    model_bytes = (Path(summary["hf"]) / "model.safetensors").stat().st_size
    assert len(published) >= 8 and all(0 < p["bytes"] < model_bytes / 5 for p in published), (published, model_bytes)
    assert (Path(summary["hf"]) / "adapter" / "adapter_model.safetensors").exists()


def test_distillation_recipe_lowers_the_reverse_kl_to_the_teacher(tmp_path, monkeypatch, home):
    from coordinator.embedded.teacher import TeacherRecipe, ensure_sft_teacher

    teacher = ensure_sft_teacher(home / "teachers", TeacherRecipe(steps=60))
    # The recipe leaves the teacher to the command line (`tandem run distillation.yaml
    # distillation.teacher.model_name=DIR`); a recipe file alone is validated without overrides.
    recipe = yaml.safe_load((RECIPES / "distillation.yaml").read_text())
    recipe["distillation"]["teacher"]["model_name"] = str(teacher)
    sizes = {"distillation.teacher.top_logprobs_k": 2, "grpo.max_num_steps": 8, "grpo.num_prompts_per_step": 8,
             "grpo.max_val_samples": 16, "grpo.val_at_start": False, "grpo.val_period": 0,
             "policy.train_global_batch_size": 8, "policy.train_micro_batch_size": 8,
             "policy.optimizer.kwargs.lr": 3e-3, "checkpointing.save_period": 4}
    summary = _run(recipe, tmp_path, monkeypatch, home, **{"logger.run_name": "distillation", **sizes})
    assert summary["algorithm"] == "distillation"
    rows = _rows(summary, "grpo")
    kl = [r["teacher_reverse_kl"] for r in rows]
    print("teacher_reverse_kl per step:", [round(k, 3) for k in kl],
          "agreement:", [round(r["teacher_top_k_agreement"], 3) for r in rows])
    assert len(rows) == 8 and all("reverse_kl" in r and "time_teacher_s" in r for r in rows)
    assert sum(kl[-2:]) / 2 < 0.5 * kl[0], kl
    assert rows[-1]["teacher_top_k_agreement"] > rows[0]["teacher_top_k_agreement"]
    settings = json.loads((Path(summary["run_dir"]) / "services" / "teacher-0.json").read_text())
    assert settings["teacher"] is True and settings["model_name"] == str(teacher)
    assert_exported_model_generates(summary)

    # as if the run crashed after its step-4 checkpoint: steps 5-8 again equal the uninterrupted run's
    from coordinator.run.create import create_run

    run_dir = Path(summary["run_dir"])
    resumed_dir = run_dir.parent / "distillation-resumed"
    shutil.copytree(run_dir, resumed_dir, ignore=shutil.ignore_patterns("summary.json", "hf", "step_000008"))
    (resumed_dir / "checkpoints" / "latest").write_text("step_000004")
    trainer = GRPOTrainer(recipe, **{**sizes, "logger.log_dir": str(run_dir.parent),
                                     "logger.run_name": "distillation-resumed", "logger.tensorboard_enabled": False,
                                     "logger.plot_enabled": False})
    try:
        create_run(trainer.config, trainer.console, resume=True).execute()
    finally:
        run_files.kill_services(resumed_dir)
    assert [e["step"] for e in run_files.events(resumed_dir) if e["event"] == "resumed"] == [4]
    again = [json.loads(line) for line in (resumed_dir / "metrics.jsonl").read_text().splitlines()]
    again = [r for r in again if r["phase"] == "grpo"]
    assert [r["step"] for r in again] == list(range(1, 9))
    for before, after in zip(rows[4:], again[4:]):
        for key in ("loss", "teacher_reverse_kl", "teacher_top_k_agreement", "grad_norm", "reward_mean"):
            assert abs(before[key] - after[key]) <= 1e-5, (before["step"], key, before[key], after[key])


PPO_SIZES = {"grpo.max_num_steps": 6, "grpo.num_prompts_per_step": 8, "grpo.num_generations_per_prompt": 4,
             "policy.train_global_batch_size": 32, "policy.train_micro_batch_size": 32, "policy.optimizer.kwargs.lr": 1e-3,
             "sft.max_num_steps": 0, "grpo.val_at_start": False, "grpo.val_period": 0, "grpo.max_val_samples": 16,
             "checkpointing.save_period": 3, "ppo.critic.train_global_batch_size": 8, "ppo.critic.num_ranks": 2,
             "cluster.trainer_ranks": 1, "cluster.restart_backoff_s": 0.5}
PPO_COMPARED = ["loss", "reward_mean", "grad_norm", "value_mean", "return_mean", "explained_variance",
                "advantage_abs_mean", "critic_value_loss", "critic_grad_norm", "critic_value_mean"]


def test_ppo_recipe_trains_the_policy_and_its_critic_and_resumes_both_exactly(tmp_path, monkeypatch, home):
    """An uninterrupted run of 6 steps, then the same run resumed from its step-3 checkpoint, whose
    critic loses its rank 1 (kill -9) after step 4: the critic is relaunched and both services go
    back to the step-3 checkpoint again. Steps 4-6 equal the uninterrupted run's."""
    from coordinator.run.create import create_run
    from reward_svc.hosted import FunctionRewardService

    digit = {"arithmetic": starts_with_a_digit}
    summary = _run("ppo", tmp_path, monkeypatch, home, reward_fns=digit, **PPO_SIZES)
    assert summary["algorithm"] == "ppo"
    rows = _rows(summary, "grpo")
    rewards = [r["reward_mean"] for r in rows]
    print("reward_mean:", [round(r, 3) for r in rewards], "critic value_mean - return_mean:",
          [round(r["value_mean"] - r["return_mean"], 3) for r in rows])
    assert len(rows) == 6 and all(abs(r["token_mult_prob_error"] - 1.0) < 0.01 for r in rows)
    assert sum(rewards[-2:]) / 2 > rewards[0] + 0.05, rewards  # measured: 0.06 -> 0.19
    # the fresh value head values every token at 0; trained, the critic's mean value follows the returns
    assert rows[0]["value_mean"] == 0.0 and all(r["critic_value_loss"] > 0 for r in rows)
    error = [abs(r["value_mean"] - r["return_mean"]) for r in rows[1:]]
    assert sum(error) < sum(r["return_mean"] for r in rows[1:]), rows  # below the untrained head's error
    run_dir = Path(summary["run_dir"])
    for step in (3, 6):
        checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
        assert (checkpoint / "critic").is_dir() and (checkpoint / "trainer").is_dir(), list(checkpoint.parent.iterdir())
    assert json.loads((run_dir / "services" / "critic.json").read_text())["value_model_cfg"]["enabled"] is True
    assert_exported_model_generates(summary)

    # as if the run crashed after its step-3 checkpoint: steps 4-6 again, from the policy's and the critic's state
    resumed_dir = run_dir.parent / "ppo-resumed"
    shutil.copytree(run_dir, resumed_dir, ignore=shutil.ignore_patterns("summary.json", "hf", "step_000006"))
    (resumed_dir / "checkpoints" / "latest").write_text("step_000003")
    trainer = GRPOTrainer(RECIPES / "ppo.yaml", reward_fns=digit, **{
        **PPO_SIZES, "logger.log_dir": str(run_dir.parent), "logger.run_name": "ppo-resumed",
        "logger.tensorboard_enabled": False, "logger.plot_enabled": False})
    run = create_run(trainer.config, trainer.console, resume=True)
    run.hosted = [FunctionRewardService(task, fn, run.log) for task, fn in digit.items()]
    killer = threading.Thread(target=_kill_critic_rank_after_step_4, args=(resumed_dir,), daemon=True)
    killer.start()
    try:
        run.execute()
    finally:
        run_files.kill_services(resumed_dir)
    killer.join(timeout=10)
    events = run_files.events(resumed_dir)
    # resumed (not started again) from step 3, and once more from step 3 after the critic's rank died
    assert [e["step"] for e in events if e["event"] == "resumed"] == [3, 3]
    assert [e["services"] for e in events if e["event"] == "trainer_dead"] == [["critic"]]
    assert [e["step"] for e in events if e["event"] == "trainer_restarted"] == [3]
    again = [json.loads(line) for line in (resumed_dir / "metrics.jsonl").read_text().splitlines()]
    again = [r for r in again if r["phase"] == "grpo"]
    assert [r["step"] for r in again] == [1, 2, 3, 4, 5, 6]
    for before, after in zip(rows[3:], again[3:]):
        for key in PPO_COMPARED:
            assert abs(before[key] - after[key]) <= 1e-5, (before["step"], key, before[key], after[key])


def _kill_critic_rank_after_step_4(run_dir: Path, timeout_s: float = 600.0) -> None:
    """SIGKILL the critic's torchrun rank 1 once the resumed run has logged its step 4."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        resumed = any(e["event"] == "resumed" for e in run_files.events(run_dir))
        if resumed and 4 in run_files.grpo_steps(run_dir):
            os.kill(run_files.torchrun_rank(run_files.services(run_dir)["critic"], 1), signal.SIGKILL)
            return
        time.sleep(0.05)


def test_recipe_mistakes_are_one_clear_error_from_the_cli(tmp_path):
    env = {**os.environ, "TANDEM_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    for args, expected in [(["rm.yaml", "policy.reward_model_cfg.enabled=false"], "policy.reward_model_cfg.enabled"),
                           (["dpo.yaml", "logger.run_name=x", "--resume"], "--resume is not supported for dpo")]:
        proc = subprocess.run([sys.executable, "-m", "coordinator.cli.main", "run", str(RECIPES / args[0]), *args[1:],
                               "logger.log_dir=runs"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2 and expected in out and "Traceback" not in out, out
    assert not (tmp_path / "runs").exists()  # nothing was launched
