"""The ppo section at load (coordinator/config/ppo.py): each mistake is one error naming the key
and what to change; a sound section makes a PPO run that launches and waits for its critic, a
trainer service holding a value model on its own settings."""

from __future__ import annotations

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.config.preference import Algorithm
from coordinator.launch.specs import all_registered, critic_settings
from coordinator.membership.registry import Member
from tandem.kinds import ServiceKind
from trainer_svc.config import ModelHead


def _load(*overrides: str):
    return load_config(None, list(overrides))


@pytest.mark.parametrize("overrides, message", [
    (["ppo.gamma=0.9"], "ppo needs a critic: add a ppo.critic section"),
    (["ppo.critic.cliprange_value=0.2", "ppo.gamma=1.5"], "less than or equal to 1"),
    (["ppo.critic.cliprange_value=0.2", "ppo.lam=-0.1"], "greater than or equal to 0"),
    (["ppo.critic.cliprange_value=0"], "greater than 0"),
    (["ppo.critic.model_name=/nonexistent"], "not a Hugging Face checkpoint directory"),
    (["ppo.critic.dtensor_cfg.tensor_parallel_size=2"], "ppo.critic trains on the DTensor backend without tensor"),
    (["ppo.critic.cliprange_value=0.2", "dpo.max_num_steps=3"], "at most one of the dpo, rm, distillation and ppo"),
    (["ppo.critic.cliprange_value=0.2", "grpo.async_grpo.enabled=true"], "ppo runs synchronously for now"),
    (["ppo.critic.cliprange_value=0.2", "grpo.use_dynamic_sampling=true"], "grpo.use_dynamic_sampling"),
    (["ppo.critic.train_global_batch_size=7"], "ppo.critic.train_global_batch_size (7) must divide"),
    (["ppo.critic.cliprange_value=0.2", "cluster.gpus_per_node=1"], "the PPO critic is launched on CPU nodes only"),
])
def test_mistakes_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _load(*overrides)


def test_a_ppo_run_launches_and_waits_for_its_critic():
    cfg = _load("ppo.critic.optimizer.kwargs.lr=0.005", "ppo.critic.num_ranks=2", "ppo.lam=0.9")
    assert cfg.algorithm is Algorithm.PPO and cfg.algorithm.uses_rollouts
    assert cfg.service_plan.critic_ranks == 2 and cfg.service_plan.generator_services == 1
    settings = critic_settings(cfg, "/models/policy")
    assert settings.model_head is ModelHead.TOKEN_VALUE and settings.model_name == "/models/policy"
    assert settings.optimizer.lr == 0.005 and settings.dtype == cfg.policy.precision
    ready = all_registered(cfg)
    members = [Member("trainer-a", ServiceKind.TRAINER, "h:1"), Member("generator-a", ServiceKind.GENERATOR, "h:2"),
               Member("reward-a", ServiceKind.REWARD, "h:3", tasks=("arithmetic",))]
    assert not ready(members) and ready([*members, Member("critic-a", ServiceKind.CRITIC, "h:4")])
    assert all_registered(cfg, trainer_only=True)(members[:1])


def test_other_runs_have_no_critic():
    assert _load().service_plan.critic_ranks == 0


def test_slurm_refuses_a_ppo_run_it_cannot_place():
    from coordinator.launch import slurm

    with pytest.raises(slurm.SlurmPlanError, match="does not place the critic service yet"):
        slurm.plan(_load("ppo.critic.cliprange_value=0.2"))


def test_a_critic_checkpoint_of_another_vocabulary_is_refused_before_the_run(tmp_path):
    import json

    from coordinator.config import ConfigError
    from coordinator.embedded.tiny_model import build_tiny_model
    from coordinator.preflight.critic import check_critic

    critic = build_tiny_model(tmp_path / "critic")
    assert "the policy's tokenizer" in check_critic(_load(f"ppo.critic.model_name={critic}"), None)
    assert "fresh value head" in check_critic(_load("ppo.critic.cliprange_value=0.2"), None)
    vocab = tmp_path / "critic" / "tokenizer.json"
    tokenizer = json.loads(vocab.read_text())
    model = tokenizer["model"]["vocab"]
    first = next(iter(model))
    model[first + "x"] = model.pop(first)  # one token renamed: same size, another vocabulary
    vocab.write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match="ppo.critic.model_name: the critic's tokenizer"):
        check_critic(_load(f"ppo.critic.model_name={critic}"), None)
