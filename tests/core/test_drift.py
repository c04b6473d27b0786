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


# ----------------------------------------------------------------------------- coverage (docs/METHOD.md#diagnostics)


def coverage_groups():
    """Three groups: K=3; K=2 with the second response truncated (masked out of the objective); K=1."""
    from ggpo_lightning.testing import make_group

    a = make_group([5], [[7], [8, 9], [7, 9]], [1.0, 0.0, 1.0], prompt_id="a",
                   behavior_logprobs=[[-0.5], [-1.0, -2.0], [-0.5, -0.25]])
    b = make_group([6], [[9, 8, 7], [8]], [0.0, 1.0], prompt_id="b", truncated=[False, True],
                   behavior_logprobs=[[-1.0, -1.0, -1.0], [-9.0]])
    c = make_group([6], [[8, 9]], [1.0], prompt_id="c", behavior_logprobs=[[-4.0, -1.0]])
    return [a, b, c]


def test_coverage_metrics_against_hand_values():
    from ggpo_lightning.core.batch import pack_step
    from ggpo_lightning.core.metrics import coverage_metrics

    batch = pack_step(coverage_groups(), 0, torch.device("cpu"), mask_truncated=True)
    token_logp = batch.target_mask.float() * -1.0  # the learner: -1 per token
    got = {k: v.item() for k, v in coverage_metrics(token_logp, batch).items()}
    # log r per valid response: a: -1-(-0.5), -2-(-3), -2-(-0.75); b: -3-(-3) (the truncated one left out); c: -2-(-5)
    log_r = [-0.5, 1.0, -1.25, 0.0, 3.0]
    w = [math.exp(x) for x in log_r]
    ess = sum(w) ** 2 / sum(x * x for x in w)
    assert got["coverage_log_ratio_max"] == pytest.approx(3.0)
    # sorted -1.25, -0.5, 0, 1, 3: the 95th percentile sits at 0.95 * 4 = 3.8 -> 1 + 0.8 * (3 - 1)
    assert got["coverage_log_ratio_p95"] == pytest.approx(2.6)
    assert got["coverage_ess"] == pytest.approx(ess) and got["coverage_ess_share"] == pytest.approx(ess / 5)
    assert got["token_log_ratio_mean"] == pytest.approx(2.25 / 10)  # 1 + 2 + 2 + 3 + 2 tokens
    assert got["token_log_ratio_max"] == pytest.approx(3.0)  # c's first token: -1 - (-4); b's -9 token masked
    assert set(got) == {"coverage_log_ratio_max", "coverage_log_ratio_p95", "coverage_ess", "coverage_ess_share",
                        "token_log_ratio_mean", "token_log_ratio_max"}


def test_coverage_is_stable_at_hundreds_of_nats_and_one_on_policy():
    from ggpo_lightning.core.drift import coverage_diagnostics

    far = coverage_diagnostics(torch.tensor([[800.0, 400, 2], [800.0, 400, 2], [0.0, 400, 0]], dtype=torch.float64))
    assert far["coverage_ess"].item() == pytest.approx(2.0) and far["coverage_ess_share"].item() == pytest.approx(2 / 3)
    on_policy = coverage_diagnostics(torch.zeros(4, 3, dtype=torch.float64))
    assert on_policy["coverage_ess_share"].item() == 1.0 and on_policy["coverage_log_ratio_max"].item() == 0.0
    assert coverage_diagnostics(torch.zeros(0, 3, dtype=torch.float64)) == {}


def _coverage_on_rank(rows: list, rank: int) -> dict[str, float]:
    from ggpo_lightning.core.distributed import gather_rows
    from ggpo_lightning.core.drift import coverage_diagnostics

    mine = torch.tensor(rows[rank], dtype=torch.float64).reshape(-1, 3)
    return {k: v.item() for k, v in coverage_diagnostics(gather_rows(mine)).items()}


def test_coverage_over_two_gloo_processes_is_that_of_all_responses():
    """Rank 0 holds 3 responses, rank 1 one: gathered, not averaged."""
    from functools import partial

    from gloo_ranks import on_two_ranks

    from ggpo_lightning.core.drift import coverage_diagnostics

    rows = [[[-0.5, 1, -0.5], [1.0, 2, 1.0], [-1.25, 2, -0.5]], [[3.0, 2, 3.0]]]
    out = on_two_ranks(partial(_coverage_on_rank, rows))
    whole = coverage_diagnostics(torch.tensor(rows[0] + rows[1], dtype=torch.float64))
    for rank in (0, 1):
        assert out[rank] == pytest.approx({k: v.item() for k, v in whole.items()})
    assert out[0]["coverage_log_ratio_max"] == 3.0  # rank 1's: a mean over ranks would give 2
