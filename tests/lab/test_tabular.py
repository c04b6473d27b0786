"""The finite-action lab: the guarantee J* - J <= C * L, and off-policy convergence to pi*."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from ggpo_lightning.lab import tabular as lab
from ggpo_lightning.cli.main import main


def random_policy(num_actions: int, gen: torch.Generator) -> torch.Tensor:
    return torch.log_softmax(2 * torch.randn(num_actions, generator=gen, dtype=torch.float64), -1)


def test_bound_holds_on_hundreds_of_random_problems_with_equality_on_policy():
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for i in range(400):
        num_actions = int(torch.randint(2, 51, (1,), generator=gen))
        beta = float(10 ** (torch.rand(1, generator=gen) * 3 - 2))  # 0.01 .. 10
        p = lab.random_problem(num_actions, beta, gen, binary_rewards=bool(i % 2))
        logp = random_policy(num_actions, gen)
        gap = lab.optimal_value(p.ref_logp, p.rewards, beta) - lab.value(logp, p.ref_logp, p.rewards, beta)
        L = lab.population_loss(logp, p.ref_logp, p.rewards, beta, p.mu_logp)
        C = lab.coverage(logp, p.mu_logp)
        assert gap >= -1e-10 and L >= -1e-10
        assert gap <= C * L * (1 + 1e-9) + 1e-10, (i, gap.item(), C.item(), L.item())
        # on policy (mu = pi): C = 1 and the bound is an equality
        L_on = lab.population_loss(logp, p.ref_logp, p.rewards, beta, logp)
        assert lab.coverage(logp, logp).item() == pytest.approx(1.0)
        assert L_on.item() == pytest.approx(gap.item(), rel=1e-9, abs=1e-10)
        checked += 1
    assert checked == 400


def test_gibbs_policy_is_the_zero_loss_optimum_for_any_behavior():
    gen = torch.Generator().manual_seed(1)
    p = lab.random_problem(8, 0.3, gen, binary_rewards=False)
    star = lab.gibbs_logp(p.ref_logp, p.rewards, p.beta)
    j_star = lab.optimal_value(p.ref_logp, p.rewards, p.beta)
    assert lab.value(star, p.ref_logp, p.rewards, p.beta).item() == pytest.approx(j_star.item(), rel=1e-12)
    for _ in range(5):
        mu = random_policy(8, gen)
        assert lab.population_loss(star, p.ref_logp, p.rewards, p.beta, mu).item() == pytest.approx(0, abs=1e-12)
    # and any other policy is strictly worse
    other = random_policy(8, gen)
    assert lab.value(other, p.ref_logp, p.rewards, p.beta) < j_star


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_offline_ggpo_converges_to_gibbs_policy_and_naive_pg_does_not(seed):
    # AGRO paper's tabular figure: fixed offline data from mu != pi_ref, full-batch Adam
    p = lab.random_problem(6, 0.5, torch.Generator().manual_seed(seed))
    assert lab.kl_divergence(p.mu_logp, p.ref_logp) > 0.05  # genuinely off-policy
    kw = dict(mode="offline", steps=600, groups=512, k=8, log_every=600, seed=seed)
    ggpo = lab.train_tabular(p, "ggpo", **kw)
    naive = lab.train_tabular(p, "naive_pg", **kw)
    start = ggpo.kl_to_optimum[0]
    assert ggpo.kl_to_optimum[-1] < 1e-3
    assert naive.kl_to_optimum[-1] > 0.05 and naive.kl_to_optimum[-1] > 0.1 * start
    # AGRO's gradient (KL-adjusted reward, group-mean baseline) also reaches pi*
    assert lab.train_tabular(p, "agro", **kw).kl_to_optimum[-1] < 1e-3


def test_online_and_stale_modes_reach_the_optimum():
    p = lab.random_problem(5, 0.5, torch.Generator().manual_seed(3))
    for mode in ("online", "stale"):
        run = lab.train_tabular(p, "ggpo", mode=mode, steps=400, groups=256, k=8, lr=0.05, sync_every=8)
        # sampling noise of fresh batches leaves a small floor
        assert run.kl_to_optimum[-1] < 1e-2 < run.kl_to_optimum[0], mode


def test_every_registered_objective_runs_in_the_lab():
    p = lab.random_problem(4, 0.5, torch.Generator().manual_seed(4))
    for name in lab.available_objectives() + list(lab.LAB_ONLY_OBJECTIVES):
        run = lab.train_tabular(p, name, steps=20, groups=32, k=4, log_every=10)
        assert run.steps == [0, 10, 20]
        assert run.kl_to_optimum[-1] != run.kl_to_optimum[0], name  # the policy moved


def test_bad_arguments():
    p = lab.random_problem(4, 0.5, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="unknown objective 'ppo'"):
        lab.train_tabular(p, "ppo")
    with pytest.raises(ValueError, match="mode"):
        lab.train_tabular(p, "ggpo", mode="async")
    with pytest.raises(ValueError, match="k >= 2"):
        lab.train_tabular(p, "ggpo", k=1)
    with pytest.raises(ValueError, match="beta"):
        lab.FiniteProblem(p.rewards, p.ref_logp, p.mu_logp, beta=0.0)
    with pytest.raises(ValueError, match=r"anchor \(lambda\) must be a finite number >= 0, got -0.1"):
        lab.train_tabular(p, "ggpo", anchor=-0.1)
    with pytest.raises(ValueError, match="logratio_bound must be > 0"):
        lab.train_tabular(p, "ggpo", logratio_bound=0.0)
    with pytest.raises(ValueError, match="policy must be one of"):
        lab.train_tabular(p, "ggpo", policy="mlp")
    # every bad argument is reported at once
    with pytest.raises(ValueError, match="anchor .*; logratio_bound"):
        lab.train_tabular(p, "ggpo", anchor=-1, logratio_bound=-1)
    with pytest.raises(ValueError, match=r"groups must be >= the number of prompts \(8\)"):
        lab.train_tabular(lab.lowrank_problem(8, 5, 0.5, torch.Generator()), "ggpo", groups=4)
    with pytest.raises(ValueError, match="anchor must be >= 0"):
        lab.anchored_optimum(p.mu_logp, p.ref_logp, 0.5, -1.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        lab.anchored_optimum(p.mu_logp, p.ref_logp, 0.0, 0.1)
    with pytest.raises(ValueError, match="num_prompts=0"):
        lab.lowrank_problem(0, 5, 0.5, torch.Generator())


def test_cli_prints_per_objective_tables_and_saves_a_plot(tmp_path):
    png = tmp_path / "sub" / "lab.png"
    result = CliRunner().invoke(main, ["tabular", "--objectives", "ggpo,naive_pg", "--steps", "300",
                                       "--log-every", "100", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "ggpo: step, KL(pi || pi*), J* - J(pi)" in result.output
    final = result.output.split("final KL(pi || pi*): ")[1].splitlines()[0]
    values = dict(item.split("=") for item in final.split(", "))
    assert float(values["ggpo"]) < 1e-3 < float(values["naive_pg"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_an_unknown_objective():
    result = CliRunner().invoke(main, ["tabular", "--objectives", "ggpo,ppo", "--steps", "1"])
    assert result.exit_code == 2
    assert "unknown ['ppo']" in result.output and "naive_pg" in result.output


def exact_anchored_minimiser(p: lab.FiniteProblem, anchor: float) -> torch.Tensor:
    """Minimise L(pi) + anchor * KL(mu || pi) directly (exact population loss, L-BFGS on logits)."""
    theta = p.ref_logp.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([theta], max_iter=500, tolerance_grad=1e-14, tolerance_change=1e-16,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        logp = torch.log_softmax(theta, -1)
        f = lab.population_loss(logp, p.ref_logp, p.rewards, p.beta, p.mu_logp) + anchor * lab.kl_divergence(
            p.mu_logp, logp)
        f.backward()
        return f

    for _ in range(5):
        opt.step(closure)
    return torch.log_softmax(theta.detach(), -1)


@pytest.mark.parametrize("anchor", [0.01, 0.1, 0.5, 2.0])
def test_anchored_optimum_is_the_minimiser_of_loss_plus_anchor(anchor):
    p = lab.random_problem(6, 0.5, torch.Generator().manual_seed(0))
    star = lab.gibbs_logp(p.ref_logp, p.rewards, p.beta)
    q = lab.anchored_optimum(p.mu_logp, star, p.beta, anchor)
    assert lab.kl_divergence(exact_anchored_minimiser(p, anchor), q) < 1e-12
    assert lab.kl_divergence(q, star) > 1e-5  # the anchor moved the optimum off pi*


def test_anchored_optimum_special_cases():
    p = lab.random_problem(7, 0.3, torch.Generator().manual_seed(5))
    star = lab.gibbs_logp(p.ref_logp, p.rewards, p.beta)
    torch.testing.assert_close(lab.anchored_optimum(p.mu_logp, star, p.beta, 0.0), star)
    # anchor = beta: rho = 1, the quadratic is q^2 = mu pi* / S, so q ∝ sqrt(mu pi*)
    geometric = torch.log_softmax((p.mu_logp + star) / 2, -1)
    torch.testing.assert_close(lab.anchored_optimum(p.mu_logp, star, p.beta, p.beta), geometric)
    # anchor >> beta: q -> mu (the quadratic becomes rho q (q - mu) = 0)
    assert lab.kl_divergence(lab.anchored_optimum(p.mu_logp, star, p.beta, 1e4), p.mu_logp) < 1e-6
    # and small anchors move it by KL(q || pi*) ~ (rho^2 / 2) Var_{pi*}(pi* / mu), rho = anchor / beta
    ratio = (star - p.mu_logp).exp()
    var = (star.exp() * ratio**2).sum() - (star.exp() * ratio).sum() ** 2
    rho = 1e-3 / p.beta
    small = lab.anchored_optimum(p.mu_logp, star, p.beta, 1e-3)
    assert lab.kl_divergence(small, star).item() == pytest.approx(0.5 * rho**2 * var.item(), rel=0.1)


def test_offline_training_with_the_anchor_lands_near_the_anchored_optimum():
    p = lab.random_problem(6, 0.5, torch.Generator().manual_seed(0))
    star = lab.gibbs_logp(p.ref_logp, p.rewards, p.beta)
    q = lab.anchored_optimum(p.mu_logp, star, p.beta, 0.1)
    run = lab.train_tabular(p, "ggpo", mode="offline", steps=600, groups=512, k=8, anchor=0.1, log_every=600)
    # q is the population (K -> infinity) optimum; groups of K = 8 shift the minimiser a little
    assert lab.kl_divergence(run.final_logp, q) < 0.1 * lab.kl_divergence(q, star)


def test_logratio_bound_stops_the_gradient_of_samples_beyond_it():
    p = lab.random_problem(5, 0.5, torch.Generator().manual_seed(2))
    gap = (p.ref_logp - p.mu_logp).abs()  # the learner starts at pi_ref, so |log pi - log mu| = gap
    kw = dict(mode="offline", steps=3, groups=64, k=4, log_every=3)
    frozen = lab.train_tabular(p, "ggpo", logratio_bound=0.5 * float(gap.min()), **kw)
    assert frozen.kl_to_optimum[-1] == frozen.kl_to_optimum[0]  # every sample is beyond: nothing moves
    free = lab.train_tabular(p, "ggpo", logratio_bound=2 * float(gap.max()), **kw)
    assert free.kl_to_optimum[-1] == lab.train_tabular(p, "ggpo", **kw).kl_to_optimum[-1]  # none is: no effect
    assert free.kl_to_optimum[-1] < free.kl_to_optimum[0]


def test_lowrank_problem_and_policy_share_parameters_across_prompts():
    p = lab.lowrank_problem(16, 20, 0.1, torch.Generator().manual_seed(0), rank=3)
    assert p.num_prompts == 16 and p.num_actions == 20
    assert torch.all(p.rewards.sum(-1) == 2)  # correct_per_prompt = 20 // 10
    torch.testing.assert_close(p.mu_logp, p.ref_logp)  # offline data are rollouts of the initial model
    # training on prompt 0 alone (groups=16 but only prompt 0's rewards differ from 0) moves other prompts
    only_first = lab.FiniteProblem(p.rewards * (torch.arange(16) == 0).double().unsqueeze(-1), p.ref_logp,
                                   p.mu_logp, p.beta)
    for policy, moves_others in (("lowrank", True), ("tabular", False)):
        run = lab.train_tabular(only_first, "ggpo", mode="online", steps=5, groups=16, k=4, policy=policy,
                                rank=3, log_every=5)
        moved = (run.final_logp - p.ref_logp).abs().amax(-1)  # [P]
        assert moved[0] > 1e-3, policy
        assert bool((moved[1:] > 1e-3).all()) == moves_others, policy


def test_stale_shared_policy_collapses_without_the_anchor_and_not_with_it():
    # docs/METHOD.md#lab-evidence: 64 prompts x 50 answers, rank 4, rollout snapshot synced every 32 steps;
    # over seeds 0-2 the final reward is 0.58 ± 0.07 without the anchor and 0.98 ± 0.02 with lambda = 0.04
    p = lab.lowrank_problem(64, 50, 0.1, torch.Generator().manual_seed(0))
    kw = dict(mode="stale", sync_every=32, steps=640, groups=512, k=8, lr=0.2, policy="lowrank", rank=4,
              log_every=640, seed=0)
    plain = lab.train_tabular(p, "ggpo", **kw)
    anchored = lab.train_tabular(p, "ggpo", anchor=0.04, **kw)
    assert plain.reward[0] < 0.15  # pi_ref's success rate, about 5 / 50
    assert plain.reward[-1] < 0.75 < 0.9 < anchored.reward[-1]
    # the drift KL(mu || pi) over a window: several nats without the anchor, about 1 with it
    assert max(plain.window_drift) > 3 > 1.5 > max(anchored.window_drift)


def test_cli_lowrank_stale_runs_every_anchor_and_reports_drift():
    result = CliRunner().invoke(main, ["tabular", "--policy", "lowrank", "--prompts", "8", "--actions", "10",
                                       "--groups", "16", "--mode", "stale", "--sync-every", "4", "--objectives",
                                       "ggpo", "--beta", "0.1", "--steps", "8", "--anchor", "0,0.04",
                                       "--log-every", "4"])
    assert result.exit_code == 0, result.output
    assert "8 prompt(s) x 10 actions" in result.output
    assert "ggpo+anchor0: step" in result.output and "ggpo+anchor0.04: step" in result.output
    drift = result.output.split("drift KL(mu || pi) at window ends, mean/max: ")[1].splitlines()[0]
    assert drift.startswith("ggpo+anchor0=") and "ggpo+anchor0.04=" in drift


@pytest.mark.parametrize(("args", "option", "message"), [
    (["--anchor", "0,-0.1"], "--anchor", "every lambda must be a finite number >= 0"),
    (["--anchor", "0,x"], "--anchor", "give comma-separated numbers"),
    (["--prompts", "4"], "--prompts", "use --policy lowrank for several"),
    (["--policy", "lowrank", "--prompts", "64", "--groups", "32"], "--groups", "every prompt needs a group"),
    (["--logratio-bound", "0"], "--logratio-bound", "not in the range x>0"),
])
def test_cli_names_the_bad_option(args, option, message):
    result = CliRunner().invoke(main, ["tabular", "--steps", "1", *args])
    assert result.exit_code == 2
    # click quotes the option in its own range errors, not in BadParameter(param_hint=...)
    assert f"Invalid value for {option}" in result.output.replace("'", ""), result.output
    assert message in result.output


# ----------------------------------------------------------------------------- the finite-group result


def test_group_expectations_sum_ggpo_loss_over_every_tuple():
    """K = 2 on 3 actions, by hand: the 9 ordered pairs, each weighted by mu(y1) mu(y2), through ggpo_loss."""
    import itertools
    import math

    from ggpo_lightning.core.objectives import ggpo_loss

    gen = torch.Generator().manual_seed(3)
    p = lab.random_problem(3, 0.4, gen)
    logp = random_policy(3, gen)
    expected_loss = expected_max = 0.0
    for y1, y2 in itertools.product(range(3), repeat=2):
        weight = math.exp(p.mu_logp[y1] + p.mu_logp[y2])
        pair = torch.tensor([[y1, y2]])
        expected_loss += weight * ggpo_loss(logp[pair], p.ref_logp[pair], p.rewards[pair], 0.4).item()
        adjusted = p.rewards[pair] - 0.4 * (logp[pair] - p.ref_logp[pair])
        expected_max += weight * adjusted.max().item()
    loss, best = lab.group_expectations(logp, p.ref_logp, p.rewards, 0.4, p.mu_logp, 2)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-9)
    assert best.item() == pytest.approx(expected_max, rel=1e-9)


@pytest.mark.parametrize("beta", [0.05, 0.5, 3.0])
@pytest.mark.parametrize("actions", [3, 5])
def test_finite_group_theorem_holds_wherever_coverage_holds(actions, beta):
    rows = lab.finite_group_checks(actions, beta, [1, 2, 3, 4], 40, torch.Generator().manual_seed(actions))
    assert len(rows) == 40 * 4 * 3
    for case, check in rows:
        assert check.holds(), (case, check)  # C = inf where uncovered: vacuous, still true
        assert check.sandwich_holds(), (case, check)  # needs no coverage at all
        assert check.shortfall >= -1e-12 and check.group_loss >= -1e-12
        if case == "on-policy":  # C = 1 and E_mu[a] = J(pi): the learner form is the sandwich's lower side
            assert check.coverage == pytest.approx(1.0) and check.learner_form_holds()
    # where mu misses actions, the bound computed with C over mu's support only is broken on some problems:
    # the loss cannot see what the behavior never samples
    assert any(not c.holds_on_support() for case, c in rows if case == "uncovered")
    assert all(c.holds_on_support() for case, c in rows if case != "uncovered")


def test_the_learner_form_is_false_at_one_response_per_group():
    """``E[max_i a(y_i)] - J(pi) <= C (E[L_K] + beta log K)`` fails at K = 1 with mu = pi* != pi: L_1 = 0 while
    E_mu[a] - J(pi) = beta (KL(pi || pi*) + KL(pi* || pi)) > 0."""
    gen = torch.Generator().manual_seed(5)
    p = lab.random_problem(4, 0.5, gen)
    star = lab.gibbs_logp(p.ref_logp, p.rewards, 0.5)
    logp = random_policy(4, gen)
    check = lab.finite_group_check(lab.FiniteProblem(p.rewards, p.ref_logp, star, 0.5), logp, 1)
    both_kls = lab.kl_divergence(logp, star) + lab.kl_divergence(star, logp)
    assert check.group_loss == pytest.approx(0.0, abs=1e-12)
    assert check.best_of_k - check.learner_value == pytest.approx(0.5 * both_kls.item(), rel=1e-9)
    assert not check.learner_form_holds() and check.holds()


def test_cli_finite_group_check_reports_and_refuses_too_many_tuples():
    result = CliRunner().invoke(main, ["tabular", "--check", "finite-group", "--actions", "3", "--k", "3",
                                       "--problems", "20"])
    assert result.exit_code == 0, result.output
    assert "theorem: holds wherever coverage holds" in result.output
    uncovered = [line.split() for line in result.output.splitlines() if line.strip().startswith("uncovered")]
    assert len(uncovered) == 3 and sum(int(row[3]) for row in uncovered) > 0  # C-on-support broken: flagged
    too_big = CliRunner().invoke(main, ["tabular", "--check", "finite-group", "--actions", "20", "--k", "5"])
    assert too_big.exit_code == 2 and "--k" in too_big.output and "20^5" in too_big.output
