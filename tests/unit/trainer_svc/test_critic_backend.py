"""A PPO critic on the DTensor backend (value_model_cfg.enabled), in a world of one rank: the
embedded tiny model with a fresh value head values every token at 0, a value depends only on
the tokens before it (values[i] is the state token P+i is sampled from), and value-loss steps
bring the values to their returns."""

import pytest

from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.config import OptimizerSettings, TrainerSettings, ValueModelSettings
from trainer_svc.types import ValueLossConfig


def _samples(returns: float = 1.0):
    from trainer_svc.types import Sample

    prompt = [1, 10, 11, 12]
    # two completions that share their first token and differ from the second on
    rows = [[20, 21, 22], [20, 30, 31], [25, 26, 27], [25, 36, 37]]
    return [Sample(prompt + row, len(prompt), returns=[returns * (i % 2)] * 3, values=[0.0] * 3)
            for i, row in enumerate(rows)]


@pytest.fixture(scope="module")
def critic(world_of_one):
    settings = TrainerSettings(model_name=str(ensure_tiny_model(cache_root())), seed=0,
                               optimizer=OptimizerSettings(lr=1e-2), value_model_cfg=ValueModelSettings(enabled=True))
    backend = DTensorBackend(settings, world_of_one)
    yield backend
    backend.close()


def test_fresh_head_values_everything_at_zero(critic):
    values = critic.compute_values(_samples(), 2)
    assert [len(v) for v in values] == [3, 3, 3, 3]
    assert all(x == 0.0 for row in values for x in row)


def test_value_steps_fit_the_returns_and_values_depend_on_the_prefix_only(critic):
    samples = _samples()
    losses = [critic.train_step(samples, ValueLossConfig(cliprange_value=None), 4, 2, None).metrics["value_loss"]
              for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0], losses
    values = critic.compute_values(samples, 4)
    # value i is the state before completion token i: rows 0 and 1 share the prompt and token 20, so their
    # first two values agree; rows 0 and 2 differ from the first token on, so only their first value agrees
    assert values[0][:2] == pytest.approx(values[1][:2], abs=1e-5)
    assert values[0][0] == pytest.approx(values[2][0], abs=1e-5)
    assert values[0][1] != pytest.approx(values[2][1], abs=1e-4)
    # the targets: rows 1 and 3 have return 1 on every token, rows 0 and 2 return 0; only the last value of
    # each row sees the suffix that tells them apart (the shared prefixes' values fit the mean, 0.5)
    assert values[1][2] > values[0][2] and values[3][2] > values[2][2], values
    assert all(0.2 < v < 0.8 for row in values for v in row[:1]), values
