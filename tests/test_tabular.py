"""The finite-action lab: the guarantee J* - J <= C * L, and off-policy convergence to pi*."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from ggpo_lightning import tabular as lab
from ggpo_lightning.cli import main


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
