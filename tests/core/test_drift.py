"""The behavior anchor and the drift diagnostics against hand-derived values."""

from __future__ import annotations

import math

import pytest
import torch

from ggpo_lightning.core.drift import behavior_anchor, drift_diagnostics

f64 = torch.float64
LOG2 = math.log(2)


def test_anchor_value_and_gradient_on_a_closed_form_example():
    # softmax policy over 3 actions at theta = 0: pi = (1/3, 1/3, 1/3), every -log pi = log 3.
    # group 0 sampled actions (0, 0, 2); group 1 only action 1 (a group of one still counts).
    theta = torch.zeros(3, dtype=f64, requires_grad=True)
    logp_all = torch.log_softmax(theta, -1)
    actions = torch.tensor([[0, 0, 2], [1, 0, 0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    anchor = behavior_anchor(logp_all[actions], mask)
    assert anchor.item() == pytest.approx(math.log(3), rel=1e-12)
    anchor.backward()
    # d(-log pi_a)/dtheta = pi - e_a, so the gradient is the mean over groups of (pi - group's empirical freq):
    # 1/2 * [(pi - (2/3, 0, 1/3)) + (pi - (0, 1, 0))] = pi - (1/3, 1/2, 1/6) = (0, -1/6, 1/6)
    torch.testing.assert_close(theta.grad, torch.tensor([0.0, -1 / 6, 1 / 6], dtype=f64))


def test_anchor_gradient_on_log_probs_and_masked_entries():
    # d anchor / d logp[g, i] = -1 / (K_g * number of groups with a valid response)
    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-3.0, float("nan"), float("nan")],
                         [float("nan")] * 3], dtype=f64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    anchor = behavior_anchor(logp, mask)
    assert anchor.item() == pytest.approx((1.5 + 3.0) / 2)  # group means 1.5 and 3; the empty group is left out
    anchor.backward()
    expected = torch.tensor([[-1 / 4, -1 / 4, 0], [-1 / 2, 0, 0], [0, 0, 0]], dtype=f64)
    torch.testing.assert_close(logp.grad, expected)


def test_anchor_of_a_batch_without_responses_is_zero_and_differentiable():
    logp = torch.zeros(2, 3, requires_grad=True)
    anchor = behavior_anchor(logp, torch.zeros(2, 3, dtype=torch.bool))
    anchor.backward()
    assert anchor.item() == 0 and torch.all(logp.grad == 0)


@pytest.mark.parametrize("off_policy", [False, True])
def test_anchor_expected_gradient_is_zero_on_policy_and_pi_minus_mu_off_policy(off_policy):
    # E_mu[grad_theta -log pi(y)] = pi - mu for a softmax policy: 0 when mu = pi.
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(5, generator=gen, dtype=f64, requires_grad=True)
    pi = torch.softmax(theta.detach(), -1)
    mu = torch.softmax(torch.randn(5, generator=gen, dtype=f64), -1) if off_policy else pi
    n = 200_000
    actions = torch.multinomial(mu, n, replacement=True, generator=gen).view(n // 8, 8)
    behavior_anchor(torch.log_softmax(theta, -1)[actions]).backward()
    # the estimate is pi - (empirical frequencies): standard error sqrt(mu_a (1 - mu_a) / n) <= 0.0012;
    # 5 standard errors leave a false failure rate below 1e-5 per coordinate
    se = (mu * (1 - mu) / n).sqrt()
    expected = pi - mu
    assert torch.all((theta.grad - expected).abs() < 5 * se), (theta.grad, expected, se)
    if off_policy:
        assert (expected.abs() > 20 * se).any()  # the off-policy pull is far outside the noise


def test_per_sequence_normalisation_is_unbiased_on_policy_and_per_length_is_not():
    # Why the anchor is not divided by each response's length: exact expectation over a
    # 2-response policy at theta = 0 (pi = (1/2, 1/2)), lengths T = (1, 2).
    # E_pi[grad -log pi(y) / T(y)] = -sum_y pi_y (e_y - pi) / T_y
    #   = -[1/2 (1/2, -1/2) / 1 + 1/2 (-1/2, 1/2) / 2] = (-1/8, 1/8): descent favours the short one.
    theta = torch.zeros(2, dtype=f64, requires_grad=True)
    logp_all = torch.log_softmax(theta, -1)
    lengths = torch.tensor([1.0, 2.0], dtype=f64)
    per_sequence = sum(logp_all[y].exp().detach() * behavior_anchor(logp_all[y].view(1, 1)) for y in range(2))
    (grad_seq,) = torch.autograd.grad(per_sequence, theta, retain_graph=True)
    per_length = sum(logp_all[y].exp().detach() * behavior_anchor(logp_all[y].view(1, 1)) / lengths[y]
                     for y in range(2))
    (grad_len,) = torch.autograd.grad(per_length, theta)
    torch.testing.assert_close(grad_seq, torch.zeros(2, dtype=f64))
    torch.testing.assert_close(grad_len, torch.tensor([-1 / 8, 1 / 8], dtype=f64))


def hand_batch():
    """Two groups; the second has one valid response (its other entry holds NaN)."""
    nan = float("nan")
    logp = torch.tensor([[0.5, 0.25], [0.1, nan]], dtype=f64).log()
    mu = torch.tensor([[0.25, 0.25], [0.4, nan]], dtype=f64).log()
    ref = torch.tensor([[0.5, 0.5], [0.1, nan]], dtype=f64).log()
    rewards = torch.tensor([[1.0, 0.0], [0.0, nan]], dtype=f64)
    mask = torch.tensor([[True, True], [True, False]])
    return logp, mu, ref, rewards, mask


def test_drift_diagnostics_against_hand_computed_values():
    d = drift_diagnostics(*hand_batch())
    # d = log pi - log mu: group 0 (log 2, 0), group 1 (-2 log 2); each group's mean, then the mean over groups
    assert d.kl_behavior_k1.item() == pytest.approx((-LOG2 / 2 + 2 * LOG2) / 2)  # 0.75 log 2
    # r - 1 - log r: r = 2 -> 1 - log 2, r = 1 -> 0, r = 1/4 -> -3/4 + 2 log 2
    assert d.kl_behavior_k3.item() == pytest.approx(((1 - LOG2) / 2 + (2 * LOG2 - 0.75)) / 2)  # 0.75 log 2 - 1/8
    assert d.logratio_correct.item() == pytest.approx(LOG2)  # only group 0 has a correct response
    assert d.logratio_wrong.item() == pytest.approx((0 + -2 * LOG2) / 2)
    # group masses: log(0.75 / 0.5) and log(0.1 / 0.4)
    assert d.log_mass_ratio.item() == pytest.approx((math.log(1.5) + math.log(0.25)) / 2)
    # log pi - log pi_ref: group 0 (0, -log 2), group 1 (0)
    assert d.logratio_ref_on_behavior.item() == pytest.approx((-LOG2 / 2 + 0) / 2)
    assert set(d.as_dict("train/")) == {"train/kl_behavior_k1", "train/kl_behavior_k3", "train/logratio_correct",
                                        "train/logratio_wrong", "train/log_mass_ratio",
                                        "train/logratio_ref_on_behavior"}


def test_drift_is_zero_on_policy_and_reward_split_is_nan_when_a_class_is_absent():
    logp, _, ref, rewards, mask = hand_batch()
    d = drift_diagnostics(logp, logp, ref, torch.zeros_like(rewards), mask)
    for name in ("kl_behavior_k1", "kl_behavior_k3", "logratio_wrong", "log_mass_ratio"):
        assert getattr(d, name).item() == 0, name
    assert math.isnan(d.logratio_correct.item())  # no correct response in the batch: undefined, not 0


def test_k3_is_unbiased_for_kl_on_behavior_samples():
    # exact expectation over a categorical mu: sum_y mu(y) * estimator(y) = KL(mu || pi) for k1 and k3
    gen = torch.Generator().manual_seed(1)
    pi = torch.log_softmax(torch.randn(6, generator=gen, dtype=f64), -1)
    mu = torch.log_softmax(torch.randn(6, generator=gen, dtype=f64), -1)
    kl = (mu.exp() * (mu - pi)).sum()
    r = (pi - mu).exp()
    k3 = (mu.exp() * (r - 1 - (pi - mu))).sum()
    assert k3.item() == pytest.approx(kl.item(), rel=1e-12)
    # and per sample the function computes exactly that estimator
    d = drift_diagnostics(pi.view(6, 1), mu.view(6, 1), pi.view(6, 1), torch.zeros(6, 1, dtype=f64))
    assert d.kl_behavior_k3.item() == pytest.approx((r - 1 - (pi - mu)).mean().item(), rel=1e-12)


def test_bad_inputs_name_the_argument():
    logp, mu, ref, rewards, mask = hand_batch()
    with pytest.raises(ValueError, match=r"logp must have shape \[G, K\]"):
        behavior_anchor(logp[0])
    with pytest.raises(ValueError, match="mask has shape"):
        behavior_anchor(logp, mask[:, :1])
    with pytest.raises(ValueError, match="mask must be a bool"):
        behavior_anchor(logp, mask.float())
    with pytest.raises(ValueError, match="mu_logp has shape"):
        drift_diagnostics(logp, mu[:, :1], ref, rewards, mask)
    rewards[1, 0] = float("inf")
    with pytest.raises(ValueError, match=r"rewards\[1, 0\] = inf"):
        drift_diagnostics(logp, mu, ref, rewards, mask)
