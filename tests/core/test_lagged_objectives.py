"""prime-rl's default loss, M2PO, OAPL and VESPO (docs/METHOD.md#objectives-that-embrace-lagged-data) against values and
gradients worked out by hand in plain Python floats, and their recipe keys."""

from __future__ import annotations

import math

import pytest
import torch

from ggpo_lightning.core.lagged_objectives import m2po_loss, m2po_mask, oapl_loss, prime_rl_loss, vespo_loss
from ggpo_lightning.core.objectives import (ObjectiveConfig, ObjectiveInputs, available_objectives, get_objective,
                                            grpo_loss)

f64 = torch.float64
ALL = torch.ones(1, 2, 2, dtype=torch.bool)  # G=1 group, K=2 responses, T=2 tokens each, all valid
REWARDS = torch.tensor([[1.0, 0.0]], dtype=f64)
LEARNER = [[0.8, 0.2], [0.6, 0.04]]  # pi(y_t), response by response
BEHAVIOR = [[0.4, 0.5], [0.1, 0.3]]  # mu(y_t)


def logs(probs: list[list[float]]) -> torch.Tensor:
    return torch.log(torch.tensor([probs], dtype=f64))  # [1, 2, 2]


def loss_and_grad(loss_fn, *args, **kwargs) -> tuple[float, torch.Tensor]:
    lp = logs(LEARNER).requires_grad_(True)
    loss = loss_fn(lp, logs(BEHAVIOR), ALL, REWARDS, *args, **kwargs)
    loss.backward()
    return loss.item(), lp.grad


# ----------------------------------------------------------------------------- prime-rl


def test_prime_rl_loss_and_gradient_by_hand():
    # A = r - mean r = +0.5, -0.5; eps = 0.2; delta = pi - mu:
    #   response 0 (A > 0): +0.4 (> eps: dropped), -0.3 (a fall: kept)
    #   response 1 (A < 0): +0.5 (a rise: kept), -0.26 (< -eps: dropped)
    kl = 0.1
    advantage = [0.5, -0.5]
    kept = [[False, True], [True, False]]
    loss, grad = 0.0, []
    for i in range(2):
        row = []
        for t in range(2):
            rho = LEARNER[i][t] / BEHAVIOR[i][t]
            policy = advantage[i] * rho if kept[i][t] else 0.0
            loss += (-policy + kl * math.log(rho) ** 2) / 4
            row.append((-policy + 2 * kl * math.log(rho)) / 4)  # d(rho)/d(log pi) = rho
        grad.append(row)
    got_loss, got_grad = loss_and_grad(prime_rl_loss, mask_threshold=0.2, kl_coef=kl)
    assert got_loss == pytest.approx(loss, abs=1e-12)
    torch.testing.assert_close(got_grad, torch.tensor([grad], dtype=f64), rtol=0, atol=1e-12)


def test_prime_rl_without_a_mask_is_the_importance_weighted_gradient():
    # eps = 0.99 drops nothing; kl_coef = 0: loss = -(1/4) * sum_t A_i * rho_t
    expected = -(0.5 * (2.0 + 0.4) - 0.5 * (6.0 + 0.04 / 0.3)) / 4
    got, _ = loss_and_grad(prime_rl_loss, mask_threshold=0.99, kl_coef=0.0)
    assert got == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------- M2PO


def m2() -> list[float]:
    return [math.log(p / q) ** 2 for lp, lq in zip(LEARNER, BEHAVIOR) for p, q in zip(lp, lq)]


def test_m2po_mask_cases_by_hand():
    # m2 = (log pi/mu)^2 = (0.48, 0.84, 3.21, 4.06); the means of the rest after dropping the k largest, k = 0..3:
    # 8.59 / 4 = 2.15, 4.53 / 3 = 1.51, 1.32 / 2 = 0.66, 0.48
    assert [round(v, 2) for v in m2()] == [0.48, 0.84, 3.21, 4.06]
    mask = lambda tau: m2po_mask(logs(LEARNER), logs(BEHAVIOR), ALL, tau).flatten().tolist()  # noqa: E731
    assert mask(2.5) == [True, True, True, True]  # 2.15 < 2.5: nothing dropped
    assert mask(1.0) == [True, True, False, False]  # 2.15, 1.51 >= 1; 0.66 < 1: the two largest dropped
    assert mask(0.1) == [True, False, False, False]  # no rest below 0.1: only the smallest kept (AReaL's rule)


def test_m2po_loss_and_gradient_by_hand():
    # tau = 1: tokens 0 and 1 kept (response 0), response 1 masked. A = +-0.5 / (std + 1e-4), std = sqrt(0.5)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    rho = [0.8 / 0.4, 0.2 / 0.5]
    loss = -(a * rho[0] + a * rho[1]) / 4
    got_loss, got_grad = loss_and_grad(m2po_loss, threshold=1.0)
    assert got_loss == pytest.approx(loss, abs=1e-12)
    torch.testing.assert_close(got_grad, torch.tensor([[[-a * rho[0] / 4, -a * rho[1] / 4], [0.0, 0.0]]],
                                                      dtype=f64), rtol=0, atol=1e-12)


def test_m2po_mask_is_over_the_step_not_each_response():
    # response 1 alone (m2 = 3.21, 4.06; means 3.64, then 3.21): no rest below 2.5, only its smaller token is kept;
    # with response 0 in the step the mean of all four is 2.15 < 2.5 and both are kept
    lp, mu = logs(LEARNER), logs(BEHAVIOR)
    only_response_1 = torch.tensor([[[False, False], [True, True]]])
    assert m2po_mask(lp, mu, only_response_1, 2.5)[0, 1].tolist() == [True, False]
    assert m2po_mask(lp, mu, ALL, 2.5)[0, 1].tolist() == [True, True]


# ----------------------------------------------------------------------------- OAPL


def test_oapl_loss_and_gradient_by_hand():
    beta, value_beta = 0.1, 1.0
    rewards = [1.0, 0.0, 0.0]
    learner, behavior = [-3.0, -5.0, -4.0], [-3.5, -4.0, -4.2]
    value = value_beta * math.log(sum(math.exp(r / value_beta) for r in rewards) / 3)  # V* = log((e + 2) / 3)
    residual = [beta * (lp - lq) - (r - value) for lp, lq, r in zip(learner, behavior, rewards)]
    loss = sum(e * e for e in residual) / 3
    grad = [2 * beta * e / 3 for e in residual]
    # a second group of one valid response (garbage elsewhere) is left out of the mean over groups
    logp = torch.tensor([learner, [-1.0, math.nan, math.inf]], dtype=f64, requires_grad=True)
    behavior_logp = torch.tensor([behavior, [-2.0, math.nan, -math.inf]], dtype=f64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    got = oapl_loss(logp, behavior_logp, torch.tensor([rewards, [1.0, math.nan, 0.0]], dtype=f64), beta,
                    value_beta, mask)
    got.backward()
    assert got.item() == pytest.approx(loss, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([grad, [0.0, 0.0, 0.0]], dtype=f64), rtol=0, atol=1e-12)


def test_oapl_optimum_is_the_lagged_policy_tilted_by_the_reward():
    # residual 0 for every response <=> beta * log(pi/mu) = r - V*: with beta = value_beta, pi = mu * exp(r/beta) / Z
    # on a group whose responses are all the behavior's support (here: 3 equally likely responses, mu = 1/3 each)
    beta = 0.5
    rewards = torch.tensor([[1.0, 0.0, 0.0]], dtype=f64)
    mu = torch.full((1, 3), math.log(1 / 3), dtype=f64)
    tilted = torch.log_softmax(mu + rewards / beta, dim=-1)  # [1, 3]
    assert oapl_loss(tilted, mu, rewards, beta, beta).item() == pytest.approx(0.0, abs=1e-24)
    assert oapl_loss(mu, mu, rewards, beta, beta).item() > 1e-3


def test_oapl_gradient_against_autograd_gradcheck():
    logp = torch.tensor([[-3.0, -5.0, -4.0]], dtype=f64, requires_grad=True)
    behavior = torch.tensor([[-3.5, -4.0, -4.2]], dtype=f64)
    rewards = torch.tensor([[1.0, 0.0, 1.0]], dtype=f64)
    assert torch.autograd.gradcheck(lambda x: oapl_loss(x, behavior, rewards, 0.1, 0.7), (logp,))


# ----------------------------------------------------------------------------- VESPO


def test_vespo_loss_and_gradient_by_hand():
    # W = prod_t pi/mu: response 0: 2 * 0.4 = 0.8 (A > 0: k, lambda = 2, 3), response 1: 6 * 0.04/0.3 = 0.8
    # (A < 0: k, lambda = 3, 2); phi(W) = W^k * exp(lambda * (1 - W)); loss = -(1/4) sum_t phi_i * A_i * log pi(y_t)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    phi = [0.8 ** 2 * math.exp(3 * 0.2), 0.8 ** 3 * math.exp(2 * 0.2)]
    advantage = [a, -a]
    loss = -sum(phi[i] * advantage[i] * math.log(p) for i in range(2) for p in LEARNER[i]) / 4
    got_loss, got_grad = loss_and_grad(vespo_loss)
    assert got_loss == pytest.approx(loss, abs=1e-12)
    expected = [[-phi[i] * advantage[i] / 4] * 2 for i in range(2)]
    torch.testing.assert_close(got_grad, torch.tensor([expected], dtype=f64), rtol=0, atol=1e-12)


def test_vespo_on_policy_is_grpo_on_policy():
    # W = 1 gives phi = 1 at any (k, lambda): the gradient is GRPO's without a behavior (ratio 1, clip inactive)
    grads = []
    for loss_fn, behavior in ((vespo_loss, logs(LEARNER)), (grpo_loss, None)):
        lp = logs(LEARNER).requires_grad_(True)
        loss_fn(lp, behavior, ALL, REWARDS).backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- registry and recipe keys


def inputs() -> ObjectiveInputs:
    token_logp, behavior = logs(LEARNER), logs(BEHAVIOR)
    return ObjectiveInputs(logp=token_logp.sum(-1), rewards=REWARDS, mask=torch.ones(1, 2, dtype=torch.bool),
                           ref_logp=torch.zeros(1, 2, dtype=f64), token_logp=token_logp, token_mask=ALL,
                           ref_token_logp=torch.zeros_like(token_logp), behavior_token_logp=behavior,
                           behavior_logp=behavior.sum(-1))


def test_the_registry_passes_the_recipe_keys_through():
    assert {"prime_rl", "m2po", "oapl", "vespo"} <= set(available_objectives())
    x = inputs()
    config = ObjectiveConfig("prime_rl", beta=0.1, clip_eps=0.2)
    assert config.errors() == []
    assert get_objective("prime_rl").loss(x, config).item() == pytest.approx(
        prime_rl_loss(x.token_logp, x.behavior_token_logp, ALL, REWARDS, mask_threshold=0.2, kl_coef=0.1).item())
    config = ObjectiveConfig("m2po", m2_threshold=1.0)
    assert config.errors() == []
    assert get_objective("m2po").loss(x, config).item() == pytest.approx(
        m2po_loss(x.token_logp, x.behavior_token_logp, ALL, REWARDS, threshold=1.0).item())
    assert get_objective("m2po").loss(x, ObjectiveConfig("m2po")).item() == pytest.approx(
        m2po_loss(x.token_logp, x.behavior_token_logp, ALL, REWARDS, threshold=0.04).item())
    config = ObjectiveConfig("oapl", beta=0.01, oapl_value_beta=2.0)
    assert config.errors() == []
    assert get_objective("oapl").loss(x, config).item() == pytest.approx(
        oapl_loss(x.logp, x.behavior_logp, REWARDS, 0.01, 2.0).item())
    assert get_objective("vespo").loss(x, ObjectiveConfig("vespo")).item() == pytest.approx(
        vespo_loss(x.token_logp, x.behavior_token_logp, ALL, REWARDS).item())
    assert all(get_objective(n).uses_behavior_logp for n in ("prime_rl", "m2po", "oapl", "vespo"))


@pytest.mark.parametrize("name, key, value", [("m2po", "m2_threshold", 0.0), ("m2po", "m2_threshold", math.inf),
                                              ("oapl", "oapl_value_beta", -1.0)])
def test_an_invalid_setting_gives_one_line_naming_the_recipe_key(name, key, value):
    errors = ObjectiveConfig(name, **{key: value}).errors()
    assert len(errors) == 1 and errors[0].startswith(f"model.objective.{key} must be") and "\n" not in errors[0]


@pytest.mark.parametrize("name, key", [("ggpo", "m2_threshold"), ("grpo", "m2_threshold"), ("m2po", "oapl_value_beta"),
                                       ("oapl", "m2_threshold"), ("prime_rl", "importance_sampling")])
def test_an_option_on_an_objective_that_does_not_take_it_is_an_error(name, key):
    value = "token_truncate" if key == "importance_sampling" else 0.5
    errors = ObjectiveConfig(name, **{key: value}).errors()
    assert len(errors) == 1 and errors[0].startswith(f"model.objective.{key} is set but objective {name!r}")


@pytest.mark.parametrize("loss_fn", [prime_rl_loss, m2po_loss, vespo_loss])
def test_garbage_off_the_mask_changes_nothing(loss_fn):
    # a padded third token holding NaN and inf, masked out, and a second group of one response: same loss, same
    # gradient on the valid tokens, 0 elsewhere
    want_loss, want_grad = loss_and_grad(loss_fn)
    lp = torch.full((2, 2, 3), math.nan, dtype=f64)
    lp[0, :, :2] = logs(LEARNER)[0]
    lp.requires_grad_(True)
    behavior = torch.full((2, 2, 3), math.inf, dtype=f64)
    behavior[0, :, :2] = logs(BEHAVIOR)[0]
    token_mask = torch.zeros(2, 2, 3, dtype=torch.bool)
    token_mask[:, :, :2] = True
    rewards = torch.tensor([[1.0, 0.0], [1.0, math.nan]], dtype=f64)
    group_mask = torch.tensor([[True, True], [True, False]])
    loss = loss_fn(lp, behavior, token_mask, rewards, group_mask)
    loss.backward()
    assert loss.item() == pytest.approx(want_loss, abs=1e-12)
    torch.testing.assert_close(lp.grad[0, :, :2], want_grad[0], rtol=0, atol=1e-12)
    assert lp.grad[1].abs().sum() == 0 and lp.grad[0, :, 2].abs().sum() == 0
