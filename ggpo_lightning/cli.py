"""Command-line entry points: ``ggpo`` (a click group of tools).

Heavy modules (torch, transformers, lightning) are imported inside the commands, so
``ggpo --help`` and ``ggpo verifiers ...`` start fast and work without torch.
"""

from __future__ import annotations

import math
import sys

import click

from ggpo_verifiers.cli import verifiers_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ggpo-lightning")
def main() -> None:
    """ggpo-lightning tools: the tabular lab, verifiers, and more."""


main.add_command(verifiers_group, "verifiers")


def _csv(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give at least one name", ctx=ctx, param=param)
    return items


@main.command()
@click.option("--objectives", default="ggpo,agro,maxrl,grpo,naive_pg", show_default=True, callback=_csv,
              help="Comma-separated objectives: registered ones plus the lab's naive_pg.")
@click.option("--mode", type=click.Choice(["offline", "online", "stale"]), default="offline", show_default=True,
              help="offline: one fixed sample of mu; online: fresh samples of pi; stale: of a snapshot.")
@click.option("--actions", type=click.IntRange(min=2), default=6, show_default=True)
@click.option("--groups", type=click.IntRange(min=1), default=512, show_default=True, help="Groups per batch.")
@click.option("--k", type=click.IntRange(min=2), default=8, show_default=True, help="Responses per group.")
@click.option("--beta", type=click.FloatRange(min=0, min_open=True), default=0.5, show_default=True)
@click.option("--steps", type=click.IntRange(min=0), default=1500, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True)
@click.option("--sync-every", type=click.IntRange(min=1), default=8, show_default=True,
              help="stale mode: refresh the behavior snapshot every N steps.")
@click.option("--log-every", type=click.IntRange(min=1), default=250, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Save a PNG plot here (needs matplotlib).")
def tabular(objectives: list[str], mode: str, actions: int, groups: int, k: int, beta: float, steps: int,
            lr: float, sync_every: int, log_every: int, seed: int, plot: str | None) -> None:
    """Train tabular policies on an exact finite-action problem.

    Prints KL(pi || pi*) and the suboptimality J* - J(pi) per objective over steps,
    where pi* is the Gibbs policy (the KL-regularized optimum).
    """
    import torch

    from ggpo_lightning import tabular as lab

    known = lab.available_objectives() + list(lab.LAB_ONLY_OBJECTIVES)
    unknown = [o for o in objectives if o not in known]
    if unknown:
        raise click.BadParameter(f"unknown {unknown}; available: {', '.join(known)}", param_hint="--objectives")
    problem = lab.random_problem(actions, beta, torch.Generator().manual_seed(seed))
    target = lab.gibbs_logp(problem.ref_logp, problem.rewards, beta)

    def fmt(t: torch.Tensor) -> str:
        return " ".join(f"{v:.3f}" for v in t.tolist())

    click.echo(f"problem: {actions} actions, beta={beta}, mode={mode}, {groups} groups x K={k}, seed={seed}")
    click.echo(f"  rewards  {fmt(problem.rewards)}")
    click.echo(f"  pi_ref   {fmt(problem.ref_logp.exp())}")
    click.echo(f"  mu       {fmt(problem.mu_logp.exp())}")
    click.echo(f"  pi*      {fmt(target.exp())}")
    runs = []
    for name in objectives:
        # record densely for the plot, print every --log-every steps
        run = lab.train_tabular(problem, name, mode=mode, steps=steps, groups=groups, k=k, lr=lr,
                                sync_every=sync_every, log_every=math.gcd(log_every, max(1, steps // 100)), seed=seed)
        runs.append(run)
        click.echo(f"\n{name}: step, KL(pi || pi*), J* - J(pi)")
        for s, kl, gap in zip(run.steps, run.kl_to_optimum, run.suboptimality):
            if s % log_every == 0 or s == steps:
                click.echo(f"  {s:6d}  {kl:10.3e}  {gap:10.3e}")
    click.echo("\nfinal KL(pi || pi*): " + ", ".join(f"{r.objective}={r.kl_to_optimum[-1]:.2e}" for r in runs))
    if plot:
        lab.plot_runs(runs, plot, f"tabular lab: {actions} actions, beta={beta}, {mode}")
        click.echo(f"plot saved to {plot}")


def train_main(args: list[str] | None = None) -> None:
    """``ggpo-train --config recipes/NAME.yaml [--model.objective.beta 0.05 ...]``: one training run.

    A LightningCLI over :class:`~ggpo_lightning.module.GGPOModule` and
    :class:`~ggpo_lightning.data.PromptGroupDataModule`; ``--print_config`` prints the
    resolved recipe, ``--ckpt_path`` resumes a run.
    """
    from ggpo_lightning.health import RunAborted
    from ggpo_lightning.train import exit_code, run_training

    try:
        run_training(args)
    except RunAborted as stop:  # the checkpoint and summary.json are saved (RunGuard); no traceback
        print(f"ggpo-train: {stop.status}: {stop}", file=sys.stderr, flush=True)
        sys.exit(exit_code(stop))


from ggpo_lightning.data_cli import data_group  # noqa: E402

main.add_command(data_group, "data")

from ggpo_lightning.eval_cli import eval_command  # noqa: E402

main.add_command(eval_command, "eval")

from ggpo_lightning.experiments_cli import report_command, sweep_command  # noqa: E402

main.add_command(sweep_command, "sweep")
main.add_command(report_command, "report")
