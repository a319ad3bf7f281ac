"""The distillation section at load (coordinator/config/distillation.py) and the teacher's
pre-flight checks (coordinator/preflight/teacher.py): each mistake is one error naming the key
and what to change; a sound section makes a distillation run that launches its teachers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.config.preference import Algorithm
from coordinator.embedded.tiny_model import build_tiny_model
from coordinator.launch.specs import all_registered, teacher_settings
from coordinator.membership.registry import Member
from coordinator.preflight.teacher import check_teacher, check_teacher_length
from tandem.kinds import ServiceKind


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A checkpoint with the embedded tokenizer (its weights do not matter here)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("teacher") / "model"))


def _load(*overrides: str):
    return load_config(None, list(overrides))


@pytest.mark.parametrize("overrides, message", [
    (["distillation.kl_penalty_coef=0.5"], "distillation needs a teacher: set distillation.teacher.model_name"),
    (["distillation.teacher.model_name=/nonexistent"], "not a Hugging Face checkpoint directory"),
    (["distillation.teacher.model_name={t}", "dpo.max_num_steps=3"], "at most one of the dpo, rm, distillation and ppo"),
    (["distillation.teacher.model_name={t}", "loss_fn.reference_policy_kl_penalty=0.1"],
     "remove loss_fn.use_kl_in_reward and loss_fn.reference_policy_kl_penalty"),
    (["distillation.teacher.model_name={t}", "distillation.kl_penalty_coef=0"], "kl_penalty_coef"),
    (["distillation.teacher.model_name={t}", "distillation.teacher.vllm_cfg.max_model_len=8",
      "policy.generation.max_new_tokens=7"], "cannot hold a prompt, policy.generation.max_new_tokens (7)"),
    (["distillation.teacher.model_name={t}", "cluster.gpus_per_node=1"], "teachers are launched on CPU nodes only"),
])
def test_mistakes_name_the_key(teacher, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _load(*(o.format(t=teacher) for o in overrides))


def test_a_distillation_run_launches_and_waits_for_its_teachers(teacher):
    cfg = _load(f"distillation.teacher.model_name={teacher}", "distillation.teacher.num_generators=2")
    assert cfg.algorithm is Algorithm.DISTILLATION and cfg.algorithm.uses_rollouts
    assert cfg.service_plan.teacher_services == 2 and cfg.service_plan.generator_services == 1
    settings = teacher_settings(cfg, 1, Path("/tmp/t"))
    assert settings.teacher and settings.model_name == teacher
    # the policy's engine settings, with one more token (the embedded model's context is 64: capped there)
    assert settings.max_model_len == 64
    ready = all_registered(cfg)
    members = [Member("trainer-a", ServiceKind.TRAINER, "h:1"), Member("generator-a", ServiceKind.GENERATOR, "h:2"),
               Member("reward-a", ServiceKind.REWARD, "h:3", tasks=("arithmetic",)),
               Member("teacher-a", ServiceKind.TEACHER, "h:4")]
    assert not ready(members) and ready([*members, Member("teacher-b", ServiceKind.TEACHER, "h:5")])
    assert not ServiceKind.TEACHER.holds_weights


def test_the_teacher_must_share_the_students_tokenizer(teacher, tmp_path):
    cfg = _load(f"distillation.teacher.model_name={teacher}")
    assert "the policy's tokenizer" in check_teacher(cfg, None)  # the embedded student's
    other = shutil.copytree(teacher, tmp_path / "other")
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["@"] = vocab.pop("!")  # one token renamed
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    cfg = _load(f"distillation.teacher.model_name={other}")
    with pytest.raises(ConfigError, match=r"teacher's tokenizer .* is not the policy's.*2 tokens differ"):
        check_teacher(cfg, None)


def test_the_longest_sequence_must_fit_the_teachers_engine(teacher):
    cfg = _load(f"distillation.teacher.model_name={teacher}")
    check_teacher_length(cfg, 59)  # 59 + 4 new + 1 = 64: fits
    with pytest.raises(ConfigError, match=r"longest prompt \(60 tokens\) \+ policy.generation.max_new_tokens \+ 1 = 65"):
        check_teacher_length(cfg, 60)


def test_slurm_refuses_a_distillation_run_it_cannot_place(teacher):
    from coordinator.launch import slurm

    with pytest.raises(slurm.SlurmPlanError, match="does not place teacher services yet"):
        slurm.plan(_load(f"distillation.teacher.model_name={teacher}"))
