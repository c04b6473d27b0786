"""Objectives against brute-force references, closed-form gradients and the properties of docs/METHOD.md."""

from __future__ import annotations

import math

import pytest
import torch

from ggpo_lightning.core.objectives import (
    IS_MODES,
    ObjectiveConfig,
    ObjectiveInputs,
    agro_loss,
    available_objectives,
    get_objective,
    ggpo_diagnostics,
    ggpo_loss,
    ggpo_weights,
    grpo_advantages,
    grpo_loss,
    maxrl_loss,
)

f64 = torch.float64


def brute_ggpo(logp, ref, r, beta, mask):
    """Per-group L_K by its definition, one Python loop per group; mean over groups with >= 2."""
    losses = []
    for g in range(logp.shape[0]):
        a = [float(r[g, i]) - beta * (float(logp[g, i]) - float(ref[g, i]))
             for i in range(logp.shape[1]) if mask[g, i]]
        if len(a) < 2:
            continue
        losses.append(beta * math.log(sum(math.exp(x / beta) for x in a) / len(a)) - sum(a) / len(a))
    return sum(losses) / len(losses) if losses else 0.0


def random_batch(G, K, seed, ragged=True):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(G, K, generator=gen, dtype=f64) * 20
    ref = -torch.rand(G, K, generator=gen, dtype=f64) * 20
    r = (torch.rand(G, K, generator=gen, dtype=f64) < 0.5).to(f64)
    mask = torch.rand(G, K, generator=gen) < 0.7 if ragged else torch.ones(G, K, dtype=torch.bool)
    return logp, ref, r, mask


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("beta", [0.05, 0.5, 3.0])
def test_ggpo_loss_matches_brute_force_on_ragged_groups(seed, beta):
    logp, ref, r, mask = random_batch(5, 7, seed)
    mask[0, 1:] = False  # a group of one: excluded from the mean
    got = ggpo_loss(logp, ref, r, beta, mask)
    assert got.item() == pytest.approx(brute_ggpo(logp, ref, r, beta, mask), rel=1e-10, abs=1e-12)


def test_masked_entries_neither_change_the_value_nor_get_gradient():
    logp, ref, r, mask = random_batch(4, 6, 0)
    mask[:, -1] = False
    garbage_logp, garbage_r = logp.clone(), r.clone()
    garbage_logp[:, -1] = float("nan")
    garbage_r[:, -1] = float("inf")
    clean = ggpo_loss(logp, ref, r, 0.3, mask)
    lp = garbage_logp.clone().requires_grad_(True)
    dirty = ggpo_loss(lp, ref, garbage_r, 0.3, mask)
    dirty.backward()
    assert dirty.item() == pytest.approx(clean.item(), rel=1e-12)
    assert torch.all(lp.grad[:, -1] == 0)
    assert torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("beta", [0.01, 0.2, 2.0])
def test_ggpo_gradient_equals_closed_form(beta):
    logp, ref, r, mask = random_batch(6, 8, 1)
    mask[2, 1:] = False  # excluded group
    lp = logp.clone().requires_grad_(True)
    ggpo_loss(lp, ref, r, beta, mask).backward()
    # dL/dlogp_i = -beta * (w_i - 1/K) / (number of groups with >= 2 responses)
    n_groups = int(((mask.sum(-1)) >= 2).sum())
    expected = -beta * ggpo_weights(logp, ref, r, beta, mask) / n_groups
    torch.testing.assert_close(lp.grad, expected, rtol=1e-10, atol=1e-13)


def test_weights_are_a_softmax_contrast():
    logp, ref, r, mask = random_batch(3, 5, 2, ragged=False)
    beta = 0.7
    a = r - beta * (logp - ref)
    w = torch.softmax(a / beta, dim=-1)
    torch.testing.assert_close(ggpo_weights(logp, ref, r, beta, mask), w - 1 / 5)
    assert torch.allclose(ggpo_weights(logp, ref, r, beta, mask).sum(-1), torch.zeros(3, dtype=f64), atol=1e-14)


@pytest.mark.parametrize("beta", [1e-3, 1e-2, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_inputs_stay_finite_and_bracketed(beta, dtype):
    gen = torch.Generator().manual_seed(3)
    G, K = 8, 16
    logp = (-torch.rand(G, K, generator=gen) * 5000).to(dtype)
    ref = (-torch.rand(G, K, generator=gen) * 5000).to(dtype)
    r = (torch.rand(G, K, generator=gen) < 0.5).to(dtype)
    lp = logp.clone().requires_grad_(True)
    loss = ggpo_loss(lp, ref, r, beta)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    per_group = torch.stack([ggpo_loss(logp[g:g + 1], ref[g:g + 1], r[g:g + 1], beta) for g in range(G)])
    a = (r - beta * (logp - ref)).double()
    upper = a.max(-1).values - a.mean(-1)
    lower = upper - beta * math.log(K)
    tol = 1e-9 if dtype == torch.float64 else 1e-3 * upper.abs().max().item() + 1e-4
    assert torch.all(per_group.double() >= lower - tol)
    assert torch.all(per_group.double() <= upper + tol)
    assert torch.all(per_group >= 0)


@pytest.mark.parametrize("seed", range(10))
def test_bracket_on_random_groups(seed):
    logp, ref, r, _ = random_batch(1, 9, seed, ragged=False)
    r = r + torch.randn(1, 9, generator=torch.Generator().manual_seed(seed), dtype=f64)
    for beta in (0.01, 0.3, 5.0):
        L = ggpo_loss(logp, ref, r, beta).item()
        a = r - beta * (logp - ref)
        upper = (a.max() - a.mean()).item()
        assert upper - beta * math.log(9) - 1e-12 <= L <= upper + 1e-12


def test_small_beta_limit_is_best_of_k_minus_mean():
    logp, ref, r, mask = random_batch(4, 8, 5, ragged=False)
    r[0] = 0.0  # an all-fail group
    expected = (r.max(-1).values - r.mean(-1)).mean().item()
    errors = [abs(ggpo_loss(logp, ref, r, beta).item() - expected) for beta in (1e-1, 1e-3, 1e-6)]
    assert errors[-1] < 1e-4
    assert errors[0] > errors[1] > errors[2]


def test_single_response_and_equal_adjusted_rewards_give_zero_loss_and_gradient():
    lp = torch.tensor([[-3.0], [-1.0]], dtype=f64, requires_grad=True)
    loss = ggpo_loss(lp, lp.detach() - 1, torch.ones(2, 1, dtype=f64), 0.5)
    loss.backward()
    assert loss.item() == 0 and torch.all(lp.grad == 0)
    # all a_i equal: r - beta (logp - ref) constant across the group
    beta = 0.5
    logp = torch.tensor([[-1.0, -2.0, -4.0]], dtype=f64, requires_grad=True)
    ref = torch.tensor([[-2.0, -3.0, -5.0]], dtype=f64)
    loss = ggpo_loss(logp, ref, torch.ones(1, 3, dtype=f64), beta)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-15)
    assert torch.allclose(logp.grad, torch.zeros_like(logp.grad), atol=1e-15)


def test_no_valid_group_gives_zero_loss_that_still_backpropagates():
    lp = torch.zeros(2, 3, dtype=f64, requires_grad=True)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    loss = ggpo_loss(lp, torch.zeros(2, 3, dtype=f64), torch.ones(2, 3, dtype=f64), 0.1, mask)
    loss.backward()
    assert loss.item() == 0 and torch.all(lp.grad == 0)


def test_agro_approximates_ggpo_when_deviations_are_small():
    gen = torch.Generator().manual_seed(7)
    logp = -torch.rand(5, 8, generator=gen, dtype=f64)
    ref = logp + 1e-3 * torch.randn(5, 8, generator=gen, dtype=f64)
    r = 0.5 + 1e-2 * torch.randn(5, 8, generator=gen, dtype=f64)
    beta = 1.0  # deviations of a ~ 1e-2 << beta
    g, a = ggpo_loss(logp, ref, r, beta).item(), agro_loss(logp, ref, r, beta).item()
    assert a > 0 and abs(g - a) / a < 2e-2
    # and it breaks when deviations (~1e-2) exceed beta
    g2, a2 = ggpo_loss(logp, ref, r, 1e-3).item(), agro_loss(logp, ref, r, 1e-3).item()
    assert abs(g2 - a2) / a2 > 0.1


def test_agro_by_hand():
    # a = r (logp == ref): group [1, 0, 0, 1] has mean 0.5 and variance 0.25 -> 0.25 / (2 * 0.5)
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=f64)
    z = torch.zeros_like(r)
    assert agro_loss(z, z, r, 0.5).item() == pytest.approx(0.25)


def test_maxrl_update_recovered_from_ggpo_at_small_beta_on_reference():
    logp, _, r, mask = random_batch(6, 8, 11)
    r[0] = 0.0  # a group with no success
    ref = logp.clone()  # pi == pi_ref, e.g. right after a reference refresh
    beta = 1e-3
    lp_g = logp.clone().requires_grad_(True)
    ggpo_loss(lp_g, ref, r, beta, mask).backward()
    lp_m = logp.clone().requires_grad_(True)
    maxrl_loss(lp_m, r, mask).backward()
    torch.testing.assert_close(lp_g.grad / beta, lp_m.grad, rtol=1e-9, atol=1e-12)
    # and the weights themselves: 1/|S| on successes, 0 elsewhere
    w = ggpo_weights(logp, ref, r, beta, mask) + mask / mask.sum(-1, keepdim=True).to(f64)
    succ = (r == 1) & mask
    expected = torch.where(succ, 1.0 / succ.sum(-1, keepdim=True).clamp(min=1).to(f64), torch.zeros_like(r))
    no_success = succ.sum(-1) == 0  # all a_i equal: uniform weights, zero contrast
    expected[no_success] = (mask / mask.sum(-1, keepdim=True).clamp(min=1).to(f64))[no_success]
    assert no_success.sum() >= 2  # group 0 and a ragged one whose successes are all masked
    valid = mask.sum(-1) >= 2
    torch.testing.assert_close(w[valid], expected[valid].to(f64), rtol=1e-9, atol=1e-12)


def test_small_beta_keeps_reference_weighting_among_successes():
    # a_i / beta = r_i / beta + log(pi_ref / pi)_i, so w_i ∝ exp(r_i / beta) * pi_ref(y_i) / pi(y_i)
    beta = 1e-3
    logp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=f64)
    ref = logp + torch.tensor([[0.0, math.log(3.0), 0.0]], dtype=f64)  # pi_ref / pi = [1, 3, 1]
    r = torch.tensor([[1.0, 1.0, 0.0]], dtype=f64)
    w = ggpo_weights(logp, ref, r, beta) + 1 / 3
    assert w[0, 1].item() / w[0, 0].item() == pytest.approx(3.0, rel=1e-9)
    assert w[0, 0].item() == pytest.approx(0.25, rel=1e-9)
    assert w[0, 2].item() == pytest.approx(0.0, abs=1e-12)


def test_maxrl_rejects_non_binary_rewards():
    with pytest.raises(ValueError, match="binary"):
        maxrl_loss(torch.zeros(1, 2), torch.tensor([[0.5, 1.0]]))


def test_grpo_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=f64)
    adv = grpo_advantages(r, torch.ones_like(r, dtype=torch.bool), std_eps=0.0)
    # mean 0.5, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3)  ->  A = +-0.5 * sqrt(3)
    s = 0.5 * math.sqrt(3)
    torch.testing.assert_close(adv[0], torch.tensor([s, -s, -s, s], dtype=f64))
    assert torch.all(adv[1] == 0)  # no variance, no signal (eps keeps it finite)


def test_grpo_on_policy_loss_and_gradient_by_hand():
    # G=1, K=2, T=2; rewards [1, 0] -> A = [+a, -a] with a = 0.5 / (std + eps), std = sqrt(0.5)
    lp = torch.log(torch.tensor([[[0.5, 0.25], [0.5, 0.5]]], dtype=f64)).requires_grad_(True)
    mask = torch.tensor([[[True, True], [True, False]]])
    r = torch.tensor([[1.0, 0.0]], dtype=f64)
    loss = grpo_loss(lp, None, mask, r, std_eps=0.0)
    a = 0.5 / math.sqrt(0.5)
    # ratio 1 everywhere: loss = -(a + a - a) / 3 valid tokens
    assert loss.item() == pytest.approx(-a / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[[-a / 3, -a / 3], [a / 3, 0.0]]], dtype=f64))


def test_grpo_clipping_stops_gradient_beyond_the_trust_region():
    behavior = torch.log(torch.full((1, 2, 1), 0.5, dtype=f64))
    lp = (behavior + math.log(1.5)).requires_grad_(True)  # ratio 1.5 > 1.2
    r = torch.tensor([[1.0, 0.0]], dtype=f64)
    loss = grpo_loss(lp, behavior, torch.ones(1, 2, 1, dtype=torch.bool), r)
    loss.backward()
    # positive advantage with ratio above 1 + eps: clipped -> no gradient;
    # negative advantage: min picks the unclipped ratio * A -> gradient flows
    assert lp.grad[0, 0, 0].item() == 0.0
    assert lp.grad[0, 1, 0].item() > 0.0


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_grpo_kl_penalty_vanishes_at_the_reference_and_is_positive_away(estimator):
    lp = torch.log(torch.tensor([[[0.3], [0.6]]], dtype=f64))
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    r = torch.ones(1, 2, dtype=f64)  # zero advantage: only the KL term remains
    at_ref = grpo_loss(lp, None, mask, r, kl_coef=0.1, ref_token_logp=lp, kl_estimator=estimator)
    assert at_ref.item() == pytest.approx(0.0, abs=1e-15)
    away = grpo_loss(lp, None, mask, r, kl_coef=0.1, ref_token_logp=lp - 0.5, kl_estimator=estimator)
    # d = ref - logp = -0.5: k1 = 0.5, k2 = 0.125, k3 = exp(-0.5) + 0.5 - 1
    expected = {"k1": 0.5, "k2": 0.125, "k3": math.exp(-0.5) - 0.5}[estimator]
    assert away.item() == pytest.approx(0.1 * expected)


def test_diagnostics():
    z = torch.zeros(2, 4, dtype=f64)
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=f64)
    d = ggpo_diagnostics(z, z, r, 1e-4)
    # group 0: w -> one-hot, ESS 1, entropy 0; group 1: uniform, ESS 4, entropy log 4
    assert d["ess"].item() == pytest.approx(2.5, rel=1e-6)
    assert d["ess_fraction"].item() == pytest.approx((0.25 + 1.0) / 2, rel=1e-6)
    assert d["weight_entropy"].item() == pytest.approx(math.log(4) / 2, rel=1e-6)
    assert d["mixed_reward_fraction"].item() == 0.5
    assert d["gibbs_gap"].item() == pytest.approx(ggpo_loss(z, z, r, 1e-4).item())


def test_registry():
    assert set(available_objectives()) >= {"ggpo", "agro", "grpo", "maxrl"}
    logp, ref = torch.randn(3, 4, dtype=f64), torch.randn(3, 4, dtype=f64)
    rewards = torch.tensor([[1.0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=f64)
    inputs = ObjectiveInputs(logp=logp, rewards=rewards, mask=torch.ones(3, 4, dtype=torch.bool), ref_logp=ref)
    config = ObjectiveConfig("ggpo", beta=0.3)
    # the registry entry is the plain loss on the step's inputs
    assert get_objective("ggpo").loss(inputs, config) == ggpo_loss(logp, ref, rewards, 0.3)
    assert get_objective("agro").loss(inputs, config) == agro_loss(logp, ref, rewards, 0.3)
    assert get_objective("grpo").level == "token" and get_objective("grpo").uses_behavior_logp
    with pytest.raises(ValueError, match="unknown objective 'ppo'.*agro, ggpo, grpo, m2po, maxrl, oapl, prime_rl, "
                                         "vespo"):
        get_objective("ppo")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beta=0.0), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(beta=float("nan")), "beta"),
        (dict(rewards=torch.tensor([[1.0, float("nan")]])), r"rewards\[0, 1\]"),
        (dict(ref_logp=torch.zeros(2, 2)), "ref_logp has shape"),
        (dict(logp=torch.zeros(2)), r"logp must have shape \[G, K\]"),
        (dict(mask=torch.ones(1, 2)), "mask must be a bool"),
        (dict(mask=torch.ones(1, 3, dtype=torch.bool)), "mask has shape"),
        (dict(rewards=torch.tensor([[1, 0]])), "float"),
    ],
)
@pytest.mark.parametrize("loss_fn", [ggpo_loss, agro_loss])
def test_bad_input_raises_value_error_naming_the_argument(loss_fn, kwargs, match):
    args = dict(logp=torch.zeros(1, 2), ref_logp=torch.zeros(1, 2), rewards=torch.tensor([[1.0, 0.0]]), beta=0.1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        loss_fn(**args)


def test_grpo_bad_input():
    lp = torch.zeros(1, 2, 3)
    m = torch.ones(1, 2, 3, dtype=torch.bool)
    r = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="token_mask has shape"):
        grpo_loss(lp, None, m[..., :2], r)
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo_loss(lp, None, m, r, kl_coef=0.1, ref_token_logp=lp, kl_estimator="k4")
    with pytest.raises(ValueError, match="ref_token_logp"):
        grpo_loss(lp, None, m, r, kl_coef=0.1)
    with pytest.raises(ValueError, match="clip_eps"):
        grpo_loss(lp, None, m, r, clip_eps=1.5)
    with pytest.raises(ValueError, match="rewards has"):
        grpo_loss(lp, None, m, torch.zeros(2, 2))


def test_an_objective_from_one_file_trains_without_touching_the_module(tiny_model_dir, data_dir):
    """docs/ADDING_AN_OBJECTIVE.md: the example file registers RLOO; the module trains with it unchanged."""
    import runpy
    from pathlib import Path

    from ggpo_lightning.core import objectives
    from training_runs import fit, make_data, make_module

    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "rloo_objective.py"
    try:
        rloo = runpy.run_path(str(path))["rloo_loss"]
        # one group of 3: rewards (1, 0, 0) -> baselines (0, 1/2, 1/2) -> advantages (1, -1/2, -1/2)
        logp = torch.tensor([[-1.0, -2.0, -4.0]], dtype=f64)
        inputs = ObjectiveInputs(logp=logp, rewards=torch.tensor([[1.0, 0.0, 0.0]], dtype=f64),
                                 mask=torch.ones(1, 3, dtype=torch.bool))
        # -(1 * -1 - 1/2 * -2 - 1/2 * -4) / 3 = -(-1 + 1 + 2) / 3
        assert rloo(inputs, ObjectiveConfig("rloo")).item() == pytest.approx(-2 / 3)
        module = make_module(tiny_model_dir, objective=ObjectiveConfig("rloo"))
        before = [p.detach().clone() for p in module.learner.parameters()]
        fit(module, make_data(data_dir), steps=2)
        assert any(not torch.equal(a, b) for a, b in zip(before, module.learner.parameters()))
    finally:
        objectives._OBJECTIVES.pop("rloo", None)


# ----------------------------------------------------------------------------- declared denominators

DECLARED_SETTINGS = ([{"name": name} for name in ("ggpo", "agro", "maxrl", "grpo")]
                     + [{"name": "grpo", "importance_sampling": mode} for mode in IS_MODES]
                     + [{"name": "grpo", "off_policy_mask_threshold": 0.05}])


@pytest.mark.parametrize("settings", DECLARED_SETTINGS, ids=lambda s: "+".join(map(str, s.values())))
def test_a_declared_denominator_makes_group_shares_add_up_to_the_loss(settings):
    """``loss(P) * denominator(P) / denominator(step)`` over a partition of the groups adds up to the step's loss,
    and so do the gradients (fp64: to 1e-12), a part whose groups count nothing (one response) included."""
    from dataclasses import fields, replace

    from ggpo_lightning.core.objectives import ObjectiveInputs, get_objective

    objective, config = get_objective(settings["name"]), ObjectiveConfig(**settings, beta=0.1)
    g = torch.Generator().manual_seed(3)
    G, K, T = 5, 4, 6
    lengths = torch.randint(1, T + 1, (G, K), generator=g)  # [G, K]
    mask = torch.ones(G, K, dtype=torch.bool)
    mask[1, 1:] = False  # a group with one response: nothing to contrast
    mask[3, 3] = False
    token_mask = (torch.arange(T) < lengths.unsqueeze(-1)) & mask.unsqueeze(-1)  # [G, K, T]
    token_logp = (-torch.rand(G, K, T, generator=g, dtype=torch.float64)).requires_grad_()
    # far enough from the learner that truncation, masks and the off-policy mask act on some tokens and responses
    behavior = token_logp.detach() + 1.5 * torch.randn(G, K, T, generator=g, dtype=torch.float64)
    ref = token_logp.detach() + 0.1 * torch.randn(G, K, T, generator=g, dtype=torch.float64)
    rewards = torch.randint(0, 2, (G, K), generator=g).double()

    def inputs_of(lp: torch.Tensor) -> ObjectiveInputs:
        zero = torch.zeros((), dtype=lp.dtype)
        lp = torch.where(token_mask, lp, zero)
        return ObjectiveInputs(logp=lp.sum(-1), rewards=rewards, mask=mask,
                               ref_logp=torch.where(token_mask, ref, zero).sum(-1), token_logp=lp,
                               token_mask=token_mask, ref_token_logp=torch.where(token_mask, ref, zero),
                               behavior_token_logp=torch.where(token_mask, behavior, zero))

    whole = objective.loss(inputs_of(token_logp), config)
    (expected,) = torch.autograd.grad(whole, token_logp)
    total = objective.denominator(mask, lengths)
    shares = []
    for part in ([0, 3], [1], [2, 4]):
        x = inputs_of(token_logp)
        x = replace(x, **{f.name: getattr(x, f.name)[part] for f in fields(x) if getattr(x, f.name) is not None})
        own = objective.denominator(mask[part], lengths[part])
        shares.append(objective.loss(x, config) * own / total.clamp(min=1))
    assert float(objective.denominator(mask[[1]], lengths[[1]])) == 0
    (got,) = torch.autograd.grad(sum(shares), token_logp)
    torch.testing.assert_close(sum(shares), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert whole.abs() > 0


def test_a_plugin_objective_declares_no_denominator_by_default():
    from ggpo_lightning.core.objectives import Objective

    assert Objective("plugin", lambda x, c: x.logp.sum(), "sequence").denominator is None
