"""Command-line entry points: ``ggpo`` (a click group of tools).

Heavy modules (torch, transformers, lightning) are imported inside the commands, so
``ggpo --help`` and ``ggpo verifiers ...`` start fast and work without torch.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

import click

from ggpo_verifiers.cli import verifiers_group

from ggpo_lightning.cli.data import data_group
from ggpo_lightning.cli.errors import debug_requested, report_user_errors
from ggpo_lightning.cli.eval import eval_command
from ggpo_lightning.cli.experiments import report_command, sweep_command
from ggpo_lightning.cli.recipes import recipes_group
from ggpo_lightning.cli.serve import serve_command

if TYPE_CHECKING:
    from torch import Tensor

    from ggpo_lightning.lab.tabular import FiniteProblem


class _UserErrorGroup(click.Group):
    """A click group whose subcommands' user errors print one line, no traceback (:mod:`~ggpo_lightning.cli.errors`)."""

    def invoke(self, ctx: click.Context):
        return report_user_errors("ggpo", lambda: super(_UserErrorGroup, self).invoke(ctx),
                                  ctx.params.get("debug", False) or debug_requested([])[0])


@click.group(cls=_UserErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ggpo-lightning")
@click.option("--debug", is_flag=True, default=False,
              help="Show the traceback of a user error (also GGPO_DEBUG=1).")
def main(debug: bool) -> None:
    """ggpo-lightning tools: the tabular lab, verifiers, and more."""


main.add_command(verifiers_group, "verifiers")
main.add_command(data_group, "data")
main.add_command(recipes_group, "recipes")
main.add_command(eval_command, "eval")
main.add_command(sweep_command, "sweep")
main.add_command(report_command, "report")
main.add_command(serve_command, "serve")


def _csv(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give at least one name", ctx=ctx, param=param)
    return items


def _floats(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    try:
        items = [float(v) for v in _csv(ctx, param, value)]
    except ValueError:
        raise click.BadParameter(f"give comma-separated numbers, got {value!r}", ctx=ctx, param=param) from None
    bad = [v for v in items if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise click.BadParameter(f"every lambda must be a finite number >= 0, got {bad}", ctx=ctx, param=param)
    return items


@main.command()
@click.option("--objectives", default="ggpo,agro,maxrl,grpo,naive_pg", show_default=True, callback=_csv,
              help="Comma-separated objectives: registered ones plus the lab's naive_pg.")
@click.option("--mode", type=click.Choice(["offline", "online", "stale"]), default="offline", show_default=True,
              help="offline: one fixed sample of mu; online: fresh samples of pi; stale: of a snapshot.")
@click.option("--policy", type=click.Choice(["tabular", "lowrank"]), default="tabular", show_default=True,
              help="tabular: free logits; lowrank: log pi_ref + U[p].V[a], shared by all prompts "
                   "(the problem is then lab.lowrank_problem, with mu = pi_ref).")
@click.option("--prompts", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of prompts (lowrank policy; the tabular problem has one).")
@click.option("--rank", type=click.IntRange(min=1), default=4, show_default=True, help="Rank of the lowrank policy.")
@click.option("--actions", type=click.IntRange(min=2), default=6, show_default=True)
@click.option("--groups", type=click.IntRange(min=1), default=512, show_default=True,
              help="Groups per batch (group g belongs to prompt g mod --prompts).")
@click.option("--k", type=click.IntRange(min=2), default=8, show_default=True, help="Responses per group.")
@click.option("--beta", type=click.FloatRange(min=0, min_open=True), default=0.5, show_default=True)
@click.option("--steps", type=click.IntRange(min=0), default=1500, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True)
@click.option("--sync-every", type=click.IntRange(min=1), default=8, show_default=True,
              help="stale mode: refresh the behavior snapshot every N steps.")
@click.option("--anchor", default="0", show_default=True, callback=_floats,
              help="Comma-separated lambdas of the behavior anchor lambda*mean(-log pi(y_i)); every objective "
                   "runs once per lambda.")
@click.option("--logratio-bound", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop the gradient of a sample once |log pi(y) - log mu(y)| exceeds this.")
@click.option("--log-every", type=click.IntRange(min=1), default=250, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Save a PNG plot here (needs matplotlib).")
@click.option("--check", type=click.Choice(["finite-group"]), default=None,
              help="Instead of training: check the finite-group result (docs/METHOD.md#the-finite-group-result) "
                   "by exact enumeration of every K-tuple, K = 1..--k, on --problems random problems of --actions.")
@click.option("--problems", type=click.IntRange(min=1), default=100, show_default=True,
              help="--check: random problems (each also on policy and with half of its actions uncovered).")
def tabular(objectives: list[str], mode: str, policy: str, prompts: int, rank: int, actions: int, groups: int, k: int,
            beta: float, steps: int, lr: float, sync_every: int, anchor: list[float], logratio_bound: float | None,
            log_every: int, seed: int, plot: str | None, check: str | None, problems: int) -> None:
    """Train policies on an exact finite-action problem.

    Prints, per objective (and anchor lambda), KL(pi || pi*), the suboptimality J* - J(pi),
    the mean reward and KL(mu || pi) to the current behavior over steps, where pi* is the
    Gibbs policy (the KL-regularized optimum); then each run's final values and its drift
    KL(mu || pi) at the end of each sync window (mean and max over windows).
    With --check finite-group: the finite-group result instead (exit code 1 if the theorem fails where it applies).
    """
    import torch

    from ggpo_lightning.lab import tabular as lab

    if check == "finite-group":
        _check_finite_group(lab, actions, beta, k, problems, torch.Generator().manual_seed(seed))
        return

    known = lab.available_objectives() + list(lab.LAB_ONLY_OBJECTIVES)
    unknown = [o for o in objectives if o not in known]
    if unknown:
        raise click.BadParameter(f"unknown {unknown}; available: {', '.join(known)}", param_hint="--objectives")
    if policy == "tabular" and prompts != 1:
        raise click.BadParameter("the tabular problem has one prompt; use --policy lowrank for several",
                                 param_hint="--prompts")
    if groups < prompts:
        raise click.BadParameter(f"every prompt needs a group: {groups} < --prompts {prompts}", param_hint="--groups")
    gen = torch.Generator().manual_seed(seed)
    if policy == "lowrank":
        problem = lab.lowrank_problem(prompts, actions, beta, gen, rank=rank)
    else:
        problem = lab.random_problem(actions, beta, gen)
    _echo_problem(problem, lab.gibbs_logp(problem.ref_logp, problem.rewards, beta), mode, groups, k, seed)
    runs = []
    for name in objectives:
        for lam in anchor:
            # record densely for the plot, print every --log-every steps
            run = lab.train_tabular(problem, name, mode=mode, steps=steps, groups=groups, k=k, lr=lr,
                                    sync_every=sync_every, log_every=math.gcd(log_every, max(1, steps // 100)),
                                    seed=seed, policy=policy, rank=rank, anchor=lam, logratio_bound=logratio_bound)
            run.objective = name if len(anchor) == 1 and lam == 0 else f"{name}+anchor{lam:g}"
            runs.append(run)
            click.echo(f"\n{run.objective}: step, KL(pi || pi*), J* - J(pi), reward, KL(mu || pi)")
            for s, kl, gap, rew, drift in zip(run.steps, run.kl_to_optimum, run.suboptimality, run.reward,
                                              run.behavior_kl):
                if s % log_every == 0 or s == steps:
                    click.echo(f"  {s:6d}  {kl:10.3e}  {gap:10.3e}  {rew:6.3f}  {drift:10.3e}")
    click.echo("\nfinal KL(pi || pi*): " + ", ".join(f"{r.objective}={r.kl_to_optimum[-1]:.2e}" for r in runs))
    click.echo("final reward: " + ", ".join(f"{r.objective}={r.reward[-1]:.3f}" for r in runs))
    if mode != "offline":
        click.echo("drift KL(mu || pi) at window ends, mean/max: " + ", ".join(
            f"{r.objective}={sum(r.window_drift) / max(1, len(r.window_drift)):.3f}/"
            f"{max(r.window_drift, default=0):.3f}" for r in runs))
    if plot:
        lab.plot_runs(runs, plot, f"tabular lab: {prompts} x {actions} actions, beta={beta}, {mode}")
        click.echo(f"plot saved to {plot}")


def _check_finite_group(lab, actions: int, beta: float, k: int, problems: int, generator) -> None:
    """Print, per case and K, how many problems break each statement of the finite-group result; exit 1 if the
    theorem fails where coverage holds."""
    if actions**k > 100_000:
        raise click.BadParameter(f"the check enumerates --actions^--k = {actions}^{k} tuples per problem, over "
                                 "100000; lower --k or --actions", param_hint="--k")
    rows = lab.finite_group_checks(actions, beta, list(range(1, k + 1)), problems, generator)
    click.echo(f"finite-group check: {problems} problems x {actions} actions, beta={beta}; per case and K, the "
               "problems where each statement fails (theorem: J*-J <= C (E[L_K] + beta log K + Delta_K))")
    click.echo("  case        K   theorem  C-on-support  sandwich  learner-form   max (J*-J)/bound")
    broken = 0
    for case in ("covered", "on-policy", "uncovered"):
        for kk in range(1, k + 1):
            cell = [c for name, c in rows if name == case and c.k == kk]
            fails = [sum(not test(c) for c in cell) for test in (
                lab.FiniteGroupCheck.holds, lab.FiniteGroupCheck.holds_on_support,
                lab.FiniteGroupCheck.sandwich_holds, lab.FiniteGroupCheck.learner_form_holds)]
            ratios = [c.gap / c.bound for c in cell if 0 < c.bound < math.inf]
            broken += fails[0] if case != "uncovered" else 0
            click.echo(f"  {case:<10} {kk:2d}  {fails[0]:7d}  {fails[1]:12d}  {fails[2]:8d}  {fails[3]:12d}   "
                       + (f"{max(ratios):.3f}" if ratios else "  -  (C = inf)"))
    click.echo("theorem: holds wherever coverage holds" if not broken else f"theorem FAILS on {broken} checks")
    if broken:
        sys.exit(1)


def _echo_problem(problem: FiniteProblem, target: Tensor, mode: str, groups: int, k: int, seed: int) -> None:
    """Print the problem: each distribution for one prompt, or the success rates for several."""
    click.echo(f"problem: {problem.num_prompts} prompt(s) x {problem.num_actions} actions, beta={problem.beta}, "
               f"mode={mode}, {groups} groups x K={k}, seed={seed}")
    if problem.num_prompts > 1:
        for name, logp in (("pi_ref", problem.ref_logp), ("mu", problem.mu_logp), ("pi*", target)):
            click.echo(f"  mean reward of {name:6s} {(logp.exp() * problem.rewards).sum(-1).mean().item():.3f}")
        return
    for name, values in (("rewards", problem.rewards), ("pi_ref", problem.ref_logp.exp()),
                         ("mu", problem.mu_logp.exp()), ("pi*", target.exp())):
        click.echo(f"  {name:8s} " + " ".join(f"{v:.3f}" for v in values.tolist()))
