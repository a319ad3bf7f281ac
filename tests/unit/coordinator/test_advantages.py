import pytest
import torch

from coordinator.loop.advantages import compute_advantages


def test_leave_one_out_baseline_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    adv = compute_advantages(rewards, leave_one_out=True, normalize=False)
    # sample 0: 1 - mean(0, 0, 1) = 2/3; sample 1: 0 - mean(1, 0, 1) = -2/3
    assert torch.allclose(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_group_mean_baseline_and_std_normalisation():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    adv = compute_advantages(rewards, leave_one_out=False, normalize=True)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std()  # unbiased: 0.5
    expected = (rewards - 0.25) / (std + 1e-6)
    assert torch.allclose(adv, expected, atol=1e-5)
    assert adv[0, 0] > 0 > adv[0, 1]


def test_loo_with_std_normalisation():
    rewards = torch.tensor([[3.0, 1.0, 2.0]])
    adv = compute_advantages(rewards, leave_one_out=True, normalize=True)
    loo = torch.tensor([3 - 1.5, 1 - 2.5, 2 - 2.0])
    assert torch.allclose(adv[0], loo / (1.0 + 1e-6), atol=1e-5)  # std of (3,1,2) is 1


@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_equal_rewards_get_zero_advantage(leave_one_out, normalize):
    rewards = torch.tensor([[1.0] * 8, [0.0] * 8, [0.3] * 8])
    adv = compute_advantages(rewards, leave_one_out=leave_one_out, normalize=normalize)
    assert torch.count_nonzero(adv) == 0


def test_groups_are_independent():
    rewards = torch.tensor([[1.0, 0.0], [5.0, 5.0]])
    adv = compute_advantages(rewards, leave_one_out=True, normalize=False)
    assert torch.equal(adv[1], torch.zeros(2))
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0]))


def test_rejects_single_sample_groups():
    with pytest.raises(ValueError, match="generations>=2"):
        compute_advantages(torch.ones(4, 1))
