"""GAE, the terminal reward and whitening (coordinator/loop/gae.py) against hand-computed values."""

import pytest
import torch

from coordinator.loop.gae import explained_variance, gae_advantages, padded, terminal_rewards, whiten


def test_gae_against_hand_computed_values():
    # gamma 0.5, lam 0.5, rewards [0, 0, 1], values [0.5, 0.25, 0.5], all masked in:
    # t=2: delta = 1 + 0.5*0 - 0.5 = 0.5                     A2 = 0.5
    # t=1: delta = 0 + 0.5*0.5 - 0.25 = 0                     A1 = 0 + 0.25*0.5 = 0.125
    # t=0: delta = 0 + 0.5*0.25 - 0.5 = -0.375                A0 = -0.375 + 0.25*0.125 = -0.34375
    # returns = A + V = [0.15625, 0.375, 1.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.5]])
    advantages, returns = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.5)
    assert advantages.tolist() == [[-0.34375, 0.125, 0.5]]
    assert returns.tolist() == [[0.15625, 0.375, 1.0]]


def test_gamma_lam_one_is_reward_to_go_minus_value():
    # gamma = lam = 1: A_t = (sum of rewards from t on) - V_t; rewards [1, 0, 1]: reward-to-go [2, 1, 1]
    # A = [2 - 0.5, 1 - 1.5, 1 + 1] = [1.5, -0.5, 2]; returns = reward-to-go
    rewards = torch.tensor([[1.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 1.5, -1.0]])
    advantages, returns = gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert advantages.tolist() == [[1.5, -0.5, 2.0]]
    assert returns.tolist() == [[2.0, 1.0, 1.0]]


def test_lam_zero_is_one_step_td():
    # lam 0: A_t = delta_t = r_t + gamma V_{t+1} - V_t; gamma 1, values [1, 2], reward [0, 3]:
    # A1 = 3 - 2 = 1, A0 = 0 + 2 - 1 = 1
    advantages, _ = gae_advantages(torch.tensor([[0.0, 3.0]]), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2),
                                   gamma=1.0, lam=0.0)
    assert advantages.tolist() == [[1.0, 1.0]]


def test_masked_tokens_are_skipped_and_padding_ends_the_episode():
    # row 0: the middle token is masked out (an environment's token): its value (9) is never read,
    # t=0 bootstraps from t=2. gamma 0.5, lam 0.5, rewards [0, 0, 1], values [0.5, 9, 0.5]:
    # A2 = 0.5; A1 = 0 (masked); A0 = (0 + 0.5*0.5 - 0.5) + 0.25*0.5 = -0.125; returns [0.375, 0, 1]
    # row 1: two tokens then padding (mask 0): A1 = 1 - 0.5 = 0.5 (no bootstrap from the padding's 7),
    # A0 = (0 + 0.5*0.5 - 0.5) + 0.25*0.5 = -0.125
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 9.0, 0.5], [0.5, 0.5, 7.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    assert advantages.tolist() == [[-0.125, 0.0, 0.5], [-0.125, 0.5, 0.0]]
    assert returns.tolist() == [[0.375, 0.0, 1.0], [0.375, 1.0, 0.0]]


def test_gae_refuses_out_of_range_gamma_and_mismatched_shapes():
    ones = torch.ones(1, 2)
    with pytest.raises(ValueError, match="gamma and lam"):
        gae_advantages(ones, ones, ones, gamma=1.5, lam=0.9)
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        gae_advantages(ones, torch.ones(1, 3), ones, gamma=1.0, lam=0.9)


def test_terminal_rewards_go_on_the_last_masked_in_token():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    out = terminal_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]


def test_whiten_over_masked_tokens():
    # masked-in values [1, 3, 5, 7]: mean 4, biased std sqrt((9+1+1+9)/4) = sqrt(5)
    advantages = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, -100.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = whiten(advantages, mask)
    s = 5 ** 0.5
    assert torch.allclose(out, torch.tensor([[-3 / s, -1 / s, 0.0], [1 / s, 3 / s, 0.0]], dtype=torch.float64))
    assert whiten(torch.full((1, 2), 3.0), torch.ones(1, 2)).tolist() == [[0.0, 0.0]]  # equal: centred only


def test_explained_variance():
    # returns [1, 2, 3] (variance 2/3); values [1, 2, 2]: residuals [0, 0, 1], variance 2/9 -> 1 - 1/3
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert explained_variance(torch.tensor([[1.0, 2.0, 2.0]]), returns, mask) == pytest.approx(2 / 3)
    assert explained_variance(returns, returns, mask) == 1.0
    assert explained_variance(torch.zeros(1, 3), torch.ones(1, 3), mask) == 0.0  # returns do not vary


def test_padded():
    assert padded([[1.0], [2.0, 3.0]]).tolist() == [[1.0, 0.0], [2.0, 3.0]]
