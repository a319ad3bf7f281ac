"""The on-policy shortcut of a GRPO TrainStep: its first optimizer step takes the previous-policy
logprobs from its own training forward instead of a separate scoring pass. With a real
DTensorBackend in a world of one rank: the loss, metrics, gradient norm and the updated weights
equal the three-pass path's, and the scoring pass is gone exactly where it is redundant."""

import pytest
import torch

from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor.backend import DTensorBackend
from trainer_svc.backends.dtensor.parallel import full_value
from trainer_svc.config import TrainerSettings
from trainer_svc.types import GrpoLossConfig, Sample


def _samples(n: int = 8) -> list[Sample]:
    generator = torch.Generator().manual_seed(3)
    samples = []
    for i in range(n):
        completion = torch.randint(4, 40, (4,), generator=generator).tolist()
        noise = (torch.rand(4, generator=generator) * 0.2).tolist()  # generator logprobs off the trainer's
        samples.append(Sample([1, 10 + i, 12, 5, *completion], 4, generation_logprobs=[-3.0 - x for x in noise],
                              advantage=(-1.0) ** i * (0.5 + 0.1 * i)))
    return samples


def _train(env, shortcut: bool, global_batch_size: int) -> tuple[dict, list[torch.Tensor], int]:
    backend = DTensorBackend(TrainerSettings(model_name=str(ensure_tiny_model(cache_root())), seed=0), env)
    backend.dropout_free = shortcut
    passes = 0
    score = backend._score

    def counting_score(batch):
        nonlocal passes
        passes += 1
        return score(batch)

    backend._score = counting_score
    loss = GrpoLossConfig(reference_policy_kl_penalty=0.0, ratio_clip_min=0.1, ratio_clip_max=0.1)
    result = backend.train_step(_samples(), loss, global_batch_size, 4, None)
    weights = [full_value(p).clone() for p in backend._params]
    return result.metrics, weights, passes


@pytest.mark.parametrize("global_batch_size, passes_saved", [(8, 2), (4, 1)])
def test_the_shortcut_equals_the_three_pass_path(world_of_one, global_batch_size, passes_saved):
    """8 samples in micro-batches of 4: one optimizer step (its 2 scoring forwards are saved), or
    two (the second step's weights moved, so it still scores: only the first step's 1 is saved)."""
    fast, fast_weights, fast_passes = _train(world_of_one, True, global_batch_size)
    slow, slow_weights, slow_passes = _train(world_of_one, False, global_batch_size)
    assert slow_passes - fast_passes == passes_saved
    for key in ("loss", "pg_loss", "grad_norm", "clip_fraction", "ratio_mean", "token_mult_prob_error",
                "importance_weight_mean"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-6, abs=1e-7), key
    if global_batch_size == 8:  # one optimizer step, on-policy: the ratio to the step's start is 1
        assert fast["ratio_mean"] == pytest.approx(1.0)
    for a, b in zip(fast_weights, slow_weights):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_dropout_turns_the_shortcut_off(world_of_one):
    from trainer_svc.backends.dtensor.model import dropout_free

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    assert not dropout_free(model) and dropout_free(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
