"""The Python API's config mapping and its errors (no services started)."""

import subprocess
import sys

import pytest

from coordinator import api
from coordinator.config import ConfigError
from coordinator.embedded.tiny_model import build_tiny_model
from coordinator.launch.specs import all_registered, launch_all
from coordinator.membership.registry import Member
from tandem.kinds import ServiceKind


def test_the_kernel_does_not_reach_the_api():
    """The API lives in coordinator.api; importing the kernel loads nothing of the coordinator."""
    code = ("import sys, tandem; assert not [m for m in sys.modules if m.split('.')[0] == 'coordinator']; "
            "from coordinator.api import GRPOTrainer, train; print(GRPOTrainer.__name__, train.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["GRPOTrainer", "train"]
    with pytest.raises(ImportError):
        from tandem import train  # noqa: F401


def test_friendly_dotted_double_underscore_and_section_overrides():
    trainer = api.GRPOTrainer({"grpo": {"seed": 3}}, max_steps=5, num_generators=2, learning_rate=1e-3,
                              sft__max_num_steps=0, **{"grpo.num_prompts_per_step": 32},
                              logger={"plot_enabled": False})
    cfg = trainer.config
    assert (cfg.grpo.max_num_steps, cfg.cluster.num_generators, cfg.policy.optimizer.kwargs.lr) == (5, 2, 1e-3)
    assert (cfg.sft.max_num_steps, cfg.grpo.num_prompts_per_step, cfg.grpo.seed) == (0, 32, 3)
    assert cfg.logger.plot_enabled is False and cfg.logger.tensorboard_enabled is True  # merged, not replaced


def test_caller_config_dict_is_not_modified():
    config = {"grpo": {"max_num_steps": 2}}
    api.GRPOTrainer(config, grpo={"max_num_steps": 7})
    assert config == {"grpo": {"max_num_steps": 2}}


def test_yaml_path_and_from_pretrained(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("grpo:\n  max_num_steps: 4\n")
    assert api.GRPOTrainer(path).config.grpo.max_num_steps == 4
    model = build_tiny_model(tmp_path / "model")
    cfg = api.GRPOTrainer.from_pretrained(model, path, max_steps=9).config
    assert cfg.policy.model_name == str(model) and cfg.grpo.max_num_steps == 9


@pytest.mark.parametrize("overrides, message", [
    ({"tensor_parallel_size": 3, "trainer_ranks": 2}, r"tensor_parallel_size \(3\) must divide cluster.trainer_ranks \(2\)"),
    ({"warp_speed": 9}, "unknown override 'warp_speed'"),
    ({"grpo__max_num_stepz": 3}, "unknown key grpo.max_num_stepz"),
    ({"grpo": 3}, "section grpo takes a dict"),
    ({"max_steps": -1}, "grpo.max_num_steps"),
])
def test_override_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        api.GRPOTrainer(None, **overrides)


def test_from_pretrained_needs_a_checkpoint_dir(tmp_path):
    with pytest.raises(ConfigError, match="policy.model_name"):
        api.GRPOTrainer.from_pretrained(tmp_path / "missing")


def test_reward_fns_mark_their_task_external_so_local_launch_skips_it(tmp_path):
    cfg = api.GRPOTrainer({"data": {"default_task": "custom"}}, reward_fns={"custom": lambda p, c, a: 1.0}).config
    assert cfg.env["custom"].external and "arithmetic" in cfg.env

    names = []

    class Launcher:
        def start(self, spec):
            names.append(spec.name)

    launch_all(cfg, str(tmp_path), tmp_path, "127.0.0.1:1", Launcher())
    assert names == ["trainer", "generator-0", "reward-arithmetic"]  # custom: served by the caller
    members = [Member("t", ServiceKind.TRAINER, "a:1"), Member("g", ServiceKind.GENERATOR, "a:2"),
               Member("r", ServiceKind.REWARD, "a:3", tasks=("arithmetic",))]
    assert not all_registered(cfg)(members)  # still waits for custom's service to register
    assert all_registered(cfg)([*members, Member("f", ServiceKind.REWARD, "a:4", tasks=("custom",))])


def test_train_rejects_rows_without_answers_and_mixed_tasks(tmp_path):
    with pytest.raises(ConfigError, match=r"row 1 lacks \['answer'\]"):
        api.train(dataset=[{"prompt": "a", "answer": "b"}, {"prompt": "c"}], reward_fn=lambda p, c, a: 0.0,
                  log_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="several tasks"):
        api.train(dataset=[{"prompt": "a", "answer": "b", "task": "x"}, {"prompt": "c", "answer": "d", "task": "y"}],
                  reward_fn=lambda p, c, a: 0.0, log_dir=str(tmp_path))
