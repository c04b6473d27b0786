"""``ggpo data ...``: generate training and benchmark data, and convert standard layouts to the package's schema.

The group is ``data_group``; ``ggpo_lightning.cli.main`` mounts it as ``ggpo data``. The
generators (sympy) are imported inside the commands, so ``ggpo --help`` stays fast.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from ggpo_lightning.records.formats import FORMATS


def _csv(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give at least one value", ctx=ctx, param=param)
    return items


@click.group(name="data")
def data_group() -> None:
    """Generate training and benchmark data; convert MATH, GSM8K, verl files to the package's schema."""


@data_group.command("synth")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for train.jsonl, test.jsonl and the parameter record task.json.")
@click.option("--families", default=None, callback=_csv,
              help="Comma-separated problem families (default: all of "
                   "arithmetic, fractions, linear, polynomial, gcd, columns).")
@click.option("--levels", default="1,2,3", show_default=True, callback=_csv,
              help="Comma-separated difficulty levels from 1 to 3.")
@click.option("--n-train", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Training problems in total, shared evenly over the family/level cells.")
@click.option("--n-test", type=click.IntRange(min=1), default=500, show_default=True,
              help="Test problems in total, shared evenly over the family/level cells.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--solutions", is_flag=True,
              help="Rows also carry a worked solution: a few steps of text and LaTeX ending in \\boxed{answer}.")
def synth_command(out: Path, families: list[str] | None, levels: list[str], n_train: int, n_test: int,
                  seed: int, solutions: bool) -> None:
    """Write synthetic math problems with LaTeX gold answers as train/test JSONL splits.

    Rows are {"id", "problem", "answer", "family", "level"} (and "solution" with --solutions); train with
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
                             n_test=n_test, seed=seed, solutions=solutions)
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


@data_group.command("convert")
@click.option("--format", "data_format", type=click.Choice(FORMATS), required=True,
              help="The input's layout: math (MATH, MATH-500: problem, solution with \\boxed{}, optional answer), "
                   "gsm8k (question, answer ending '#### 72'), prompt-answer (--prompt-field, --answer-field), "
                   "verl (DAPO-Math-17k: prompt as chat messages, reward_model.ground_truth).")
@click.argument("source", metavar="INPUT", type=click.Path(exists=True, path_type=Path))
@click.argument("output", metavar="OUTPUT.jsonl", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--split", default="train", show_default=True,
              help="For a save_to_disk folder holding several splits: the split to convert.")
@click.option("--prompt-field", default="prompt", show_default=True, help="prompt-answer layout: the prompt field.")
@click.option("--answer-field", default="answer", show_default=True, help="prompt-answer layout: the gold field.")
@click.option("--verifier", "-v", default="math", show_default=True,
              help="The verifier the golds must be usable by (the one you will train and evaluate with).")
def convert_command(data_format: str, source: Path, output: Path, split: str, prompt_field: str, answer_field: str,
                    verifier: str) -> None:
    """Convert INPUT (a local JSONL or Parquet file, or a datasets save_to_disk folder) to the package's schema:
    OUTPUT.jsonl rows {"prompt", "answer", ...the source's other fields}, the gold extracted once.

    Rows without a usable gold (none found, or one the verifier cannot read) are listed by line on stderr and
    left out; training and `ggpo eval` read OUTPUT as it is.
    """
    from ggpo_lightning.records.atomic import atomic_write_text
    from ggpo_lightning.records.errors import DataError
    from ggpo_lightning.records.formats import convert_records
    from ggpo_lightning.records.prompts import read_source
    from ggpo_verifiers.cli import build_verifier

    if output.resolve() == source.resolve():
        raise click.BadParameter("OUTPUT must differ from INPUT", param_hint="OUTPUT.jsonl")
    with build_verifier(verifier, timeout=5.0, workers=None) as checker:
        try:
            rows, left_out = convert_records(read_source(source, split), data_format, checker, prompt_field,
                                             answer_field)
        except (DataError, ValueError) as err:  # an unreadable file or line: nothing can be converted
            raise click.ClickException(str(err)) from None
    for message in left_out:
        click.echo(f"left out: {message}", err=True)
    if not rows:
        raise click.ClickException(f"{source}: no row has a usable prompt and gold ({len(left_out)} left out); "
                                   "is --format right?")
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    click.echo(f"{len(rows)} rows written to {output} ({len(left_out)} left out)")
