"""``ggpo sweep`` (run an experiment grid) and ``ggpo report`` (tables and plots over runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ggpo_lightning.records.atomic import atomic_write_text
from ggpo_lightning.records.extras import EXTRAS, installed


@click.command("sweep")
@click.argument("grid_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print each run's ggpo-train arguments; run nothing.")
@click.option("--shard", default="1/1", show_default=True, metavar="I/N",
              help="Run only every N-th run starting at the I-th: start `--shard 1/2` and `--shard 2/2` side by side "
                   "to run a grid on two processes (each with its own runs).")
def sweep_command(grid_file: Path, dry_run: bool, shard: str) -> None:
    """Run every objective x setting x seed of GRID_FILE, one ggpo-train run after another.

    Finished runs (with summary.json) are skipped, so an interrupted sweep continues
    where it stopped. See ggpo_lightning/lab/sweep.py for the grid format.
    """
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise click.UsageError(f"--shard must be I/N with 1 <= I <= N, got {shard!r}")
    from ggpo_lightning.lab.sweep import SweepStopped, load_grid, run_grid

    try:
        grid = load_grid(grid_file)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        results = run_grid(grid, dry_run=dry_run, echo=click.echo, shard=(int(index) - 1, int(count)))
    except SweepStopped as stopped:
        _echo_counts(stopped.results)
        click.echo(f"{stopped}; run it again to go on", err=True)
        sys.exit(128 + stopped.signum)
    if _echo_counts(results):
        sys.exit(1)


def _echo_counts(results: list) -> list[str]:
    """Print how many runs were done, ran, planned, interrupted and failed; return the failed runs' names."""
    failed = [run.name for run, status in results if status.startswith("failed")]
    click.echo(f"{len(results)} runs: " + ", ".join(
        f"{sum(s == k for _, s in results)} {k}" for k in ("done", "ran", "planned", "interrupted")
        if any(s == k for _, s in results)) + (f", {len(failed)} failed: {', '.join(failed)}" if failed else ""))
    return failed


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write report.md and PNG plots here (plots need matplotlib; without it the tables only).")
@click.option("--settings", default=None, help="Comma-separated column order, e.g. sync1,sync8,sync32,offline.")
@click.option("--lead-plot", default=None,
              help="Comma-separated settings (e.g. sync1,sync4,sync16,sync64) for lead_vs_staleness.png: GGPO's lead "
                   "over the best of GRPO and its corrections, and over each of OAPL, M2PO, prime_rl and VESPO that "
                   "ran, against their measured mean staleness.")
def report_command(run_dirs: tuple[Path, ...], out: Path | None, settings: str | None, lead_plot: str | None) -> None:
    """Final held-out accuracy (mean ± std over seeds) per objective x setting for RUN_DIRS
    (run directories, or folders holding them), and learning-curve plots.

    A directory that is not a readable run is named on stderr; the others are still
    reported, and the exit code is 1. Unfinished runs (no summary.json) are named and
    left out.
    """
    from ggpo_lightning.lab.report import (STEP_MEANS, collect_runs, family_lead_table, gain_table, lead_table,
                                           markdown_table, plot_curves, plot_lead, step_mean_table)

    runs, errors = collect_runs(list(run_dirs))
    for error in errors:
        click.echo(f"error: {error}", err=True)
    unfinished = [r for r in runs if r.final_accuracy is None]
    if unfinished:
        click.echo(f"left out, unfinished (no summary.json): {', '.join(str(r.path) for r in unfinished)}", err=True)
    runs = [r for r in runs if r.final_accuracy is not None]
    if not runs:
        raise click.ClickException("no finished runs to report")
    order = [s.strip() for s in settings.split(",")] if settings else None
    sections = [("Final held-out accuracy (%)", markdown_table(runs, order)),
                ("Gain over the starting model (points)", gain_table(runs, order))]
    sections += [(f"{title}, mean over the run's steps", step_mean_table(runs, metric, order))
                 for metric, (title, _) in STEP_MEANS.items()]
    leading = lead_table(runs, settings_order=order)
    if leading.count("\n") > 2:  # a GGPO and a rival ran in some setting
        sections.append(("GGPO's lead over the best of GRPO and its corrections (over the seeds both ran)", leading))
    family = family_lead_table(runs, settings_order=order)
    if family.count("\n") > 2:  # GGPO and an objective of its family ran in some setting
        sections.append(("GGPO's lead over each objective that also embraces lagged data (over the seeds both ran)",
                         family))
    text = "".join(f"## {title}\n\n{table}\n" for title, table in sections)
    click.echo(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        plots = plot_curves(runs, out, order) if installed("matplotlib") else []
        if lead_plot and plots:
            plots.append(plot_lead(runs, out, [s.strip() for s in lead_plot.split(",")]))
        atomic_write_text(out / "report.md", text + "".join(f"![{p.stem}]({p.name})\n" for p in plots))
        click.echo(f"report written to {out / 'report.md'} with {len(plots)} plots")
        if not installed("matplotlib"):  # the tables are written all the same
            click.echo(f"plots skipped: matplotlib is not installed (pip install 'ggpo-lightning[{EXTRAS['matplotlib']}]')",
                       err=True)
    if errors:
        sys.exit(1)
