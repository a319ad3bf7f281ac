"""The loss registry (trainer_svc.types.LOSSES) is the one list of losses: every entry goes
through the client's proto conversion and back through the server's, builds its torch loss and
is accepted by the engine; the proto's `loss` oneof holds exactly the registered names; and no
other trainer module names a loss."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import structlog
import torch

from protos.tandem.trainer.v1 import trainer_pb2 as pb
from trainer_svc.client import _train_request
from trainer_svc.engine import TrainerEngine
from trainer_svc.losses import LossFn, build_loss_fn
from trainer_svc.server import _loss
from trainer_svc.types import LOSSES, GrpoLossConfig, LossKind, Sample, StepResult, loss_kind, loss_kind_named

ROOT = Path(__file__).resolve().parents[3]
# Where a loss is defined: the registry with the config classes, and each loss's own module.
DEFINING = {"trainer_svc/types.py", "trainer_svc/losses/grpo.py", "trainer_svc/losses/nll.py",
            "trainer_svc/losses/preference.py", "trainer_svc/losses/distillation.py",
            "trainer_svc/losses/value.py"}
# Not a loss named: the value of NeMo-RL's reward_model_cfg.reward_model_type key.
ALLOWED = {"trainer_svc/config/__init__.py": {"bradley_terry"}}
KINDS = pytest.mark.parametrize("kind", LOSSES, ids=[k.name for k in LOSSES])


def test_proto_oneof_holds_the_registered_losses():
    oneof = pb.TrainStepRequest.DESCRIPTOR.oneofs_by_name["loss"]
    assert sorted(f.name for f in oneof.fields) == sorted(k.name for k in LOSSES)
    assert len({k.config for k in LOSSES}) == len(LOSSES)


@KINDS
def test_round_trip_through_the_proto(kind: LossKind):
    config = kind.config()
    request = _train_request(config, global_batch_size=2, micro_batch_size=2)
    assert request.WhichOneof("loss") == kind.name
    back = _loss(pb.TrainStepRequest.FromString(request.SerializeToString()))
    assert type(back) is kind.config and _same(back, config)
    assert loss_kind(config) is kind and loss_kind_named(kind.name) is kind


def test_round_trip_keeps_non_default_settings():
    config = GrpoLossConfig(reference_policy_kl_penalty=0.05, ratio_clip_max=0.28, token_level_loss=False,
                            reference_policy_kl_type="k1", kl_input_clamp_value=None)
    assert _same(_loss(_train_request(config)), config)


def _same(a, b) -> bool:
    """Equal settings, floats to the proto's float32 precision."""
    left, right = a.model_dump(), b.model_dump()
    return left.keys() == right.keys() and all(
        left[k] == pytest.approx(right[k], rel=1e-6) if isinstance(right[k], float) else left[k] == right[k]
        for k in right)


@KINDS
def test_builds_a_loss_that_agrees_with_its_entry(kind: LossKind):
    loss_fn = build_loss_fn(kind.config())
    assert isinstance(loss_fn, LossFn)
    assert loss_fn.needs_generation_logprobs == kind.needs_generation_logprobs
    assert loss_fn.takes_sequence_scores == kind.reward_model
    assert loss_fn.takes_token_values == kind.value_model


class _Backend:
    rank, world_size, vocab_size, global_step = 0, 1, 16, 0
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.losses: list = []

    def train_step(self, samples, loss, global_batch_size, micro_batch_size, learning_rate):
        self.losses.append(loss)
        return StepResult({"loss": 0.0}, 1)


class _Lockstep:
    def run(self, command, execute):
        return execute(command)


@KINDS
def test_the_engine_accepts_it(kind: LossKind):
    backend = _Backend()
    engine = TrainerEngine(backend, _Lockstep(), model_name="m", plan=None, sender=None, fingerprint="",
                           log=structlog.get_logger(), head=kind.model_head)
    pair = [Sample((1, 5, 6), 1, generation_logprobs=(-1.0, -1.0), teacher_logprobs=(-0.5, -0.5),
                   returns=(1.0, 1.0), values=(0.0, 0.0)),
            Sample((1, 7), 1, generation_logprobs=(-1.0,), teacher_logprobs=(-0.5,), returns=(0.0,), values=(0.0,))]
    assert engine.train_step(pair, kind.config(), global_batch_size=2, micro_batch_size=2).global_step == 1
    assert backend.losses == [kind.config()]


def test_unknown_losses_are_refused():
    with pytest.raises(ValueError, match="unknown loss 'ppo'"):
        loss_kind_named("ppo")
    with pytest.raises(TypeError, match="unknown loss"):
        _train_request(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not set \(grpo, nll, dpo, bradley_terry, distillation, ppo_value\)"):
        _loss(pb.TrainStepRequest())


def _words(path: Path) -> set[str]:
    """The string constants and names a module's code uses (docstrings are constants too; a
    loss name in prose is a longer string, so only exact names count)."""
    tree = ast.parse(path.read_text())
    words = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    words |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    words |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    words |= {a.name.rsplit(".", 1)[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return words


def test_no_other_trainer_module_names_a_loss():
    names = {k.name for k in LOSSES} | {k.config.__name__ for k in LOSSES}
    offenders = {}
    for path in sorted((ROOT / "trainer_svc").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative not in DEFINING and (found := names & _words(path) - ALLOWED.get(relative, set())):
            offenders[relative] = sorted(found)
    assert not offenders, f"losses named outside the registry (trainer_svc.types.LOSSES): {offenders}"
