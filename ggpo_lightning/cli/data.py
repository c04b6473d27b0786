"""``ggpo data ...``: generate training and benchmark data.

The group is ``data_group``; ``ggpo_lightning.cli.main`` mounts it as ``ggpo data``. The
generators (sympy) are imported inside the commands, so ``ggpo --help`` stays fast.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click


def _csv(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give at least one value", ctx=ctx, param=param)
    return items


@click.group(name="data")
def data_group() -> None:
    """Generate training and benchmark data."""


@data_group.command("synth")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for train.jsonl, test.jsonl and the parameter record task.json.")
@click.option("--families", default=None, callback=_csv,
              help="Comma-separated problem families (default: all of "
                   "arithmetic, fractions, linear, polynomial, gcd).")
@click.option("--levels", default="1,2,3", show_default=True, callback=_csv,
              help="Comma-separated difficulty levels from 1 to 3.")
@click.option("--n-train", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Training problems in total, shared evenly over the family/level cells.")
@click.option("--n-test", type=click.IntRange(min=1), default=500, show_default=True,
              help="Test problems in total, shared evenly over the family/level cells.")
@click.option("--seed", type=int, default=0, show_default=True)
def synth_command(out: Path, families: list[str] | None, levels: list[str], n_train: int, n_test: int,
                  seed: int) -> None:
    """Write synthetic math problems with LaTeX gold answers as train/test JSONL splits.

    Rows are {"id", "problem", "answer", "family", "level"}; train with
    data.prompt_field=problem. Prompts are distinct and the splits disjoint. Rerunning with
    the same options reuses the files; other options over an existing --out are an error.
    """
    from ggpo_lightning.tasks.synth_math import FAMILIES, LEVELS, SynthMathConfig, write_synth_splits

    families = list(dict.fromkeys(families or FAMILIES))  # repeats dropped, order kept
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; valid families: {', '.join(FAMILIES)}",
                                 param_hint="--families")
    try:
        parsed_levels = list(dict.fromkeys(int(level) for level in levels))
    except ValueError:
        parsed_levels = []
    if not parsed_levels or any(level not in LEVELS for level in parsed_levels):
        raise click.BadParameter(f"{','.join(levels)}: levels must be integers from {LEVELS[0]} to {LEVELS[-1]}",
                                 param_hint="--levels")
    config = SynthMathConfig(families=tuple(families), levels=tuple(parsed_levels), n_train=n_train,
                             n_test=n_test, seed=seed)
    try:
        train_path, test_path = write_synth_splits(config, out)
    except (ValueError, FileExistsError) as err:  # too many rows asked, or --out holds other data
        raise click.ClickException(str(err)) from err

    # Counted from the files, which may be reused ones from an earlier run.
    counts = {}
    for split, path in (("train", train_path), ("test", test_path)):
        with path.open(encoding="utf-8") as f:
            counts[split] = Counter((row["family"], row["level"]) for row in map(json.loads, f))
    click.echo(f"{'family':<12} {'level':>5} {'train':>7} {'test':>7}")
    for family, level in config.cells:
        click.echo(f"{family:<12} {level:>5} {counts['train'][family, level]:>7} {counts['test'][family, level]:>7}")
    click.echo(f"{'total':<12} {'':>5} {sum(counts['train'].values()):>7} {sum(counts['test'].values()):>7}")
    click.echo(f"train: {train_path}")
    click.echo(f"test:  {test_path}")
