"""``ggpo verifiers ...``: list, try and batch-score answer checkers from the shell.

The group is ``verifiers_group``; ``ggpo_lightning.cli.main`` mounts it as ``ggpo verifiers``
and ``python -m ggpo_verifiers`` runs it on its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ggpo_verifiers.base import GoldAnswerError, Verifier
from ggpo_verifiers.registry import UnknownVerifierError, available_verifiers, get_verifier

UNBOXED_WARNING_SHARE = 0.5
"""``score`` suggests checking the prompt template when more responses than this are unboxed."""
VERIFIER_HELP = (  # the --verifier option's help, shared with ggpo eval
    "Registry name, class path (pkg.mod.Cls) or JSON spec "
    '\'{"class_path": ..., "init_args": {...}}\'.'
)


def _verifier_options(command: Any) -> Any:
    command = click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: min(4, CPUs)).")(command)
    command = click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True, help="Seconds per check before it scores 0.")(command)
    return click.option("--verifier", "-v", default="math", show_default=True, help=VERIFIER_HELP)(command)


def build_verifier(spec: str, timeout: float, workers: int | None) -> Verifier:
    """The verifier a ``--verifier`` option names (registry name, class path or JSON spec); a bad spec is a
    ``click.BadParameter`` naming ``--verifier``. Also used by ``ggpo eval``."""
    try:
        parsed = json.loads(spec) if spec.lstrip().startswith("{") else spec
        return get_verifier(parsed, timeout=timeout, workers=workers)
    except (json.JSONDecodeError, UnknownVerifierError, TypeError, ValueError, ImportError, AttributeError) as err:
        raise click.BadParameter(str(err), param_hint="--verifier") from err


@click.group(name="verifiers")
def verifiers_group() -> None:
    """Answer checkers that turn model responses into rewards."""


@verifiers_group.command("list")
def list_command() -> None:
    """List built-in verifiers and plugins found through entry points."""
    for name, source in available_verifiers().items():
        click.echo(f"{name:<16} {source}")


@verifiers_group.command("check")
@_verifier_options
@click.option("--gold", required=True, help="The gold answer, e.g. '\\frac12'.")
@click.option("--response", required=True, help="The model response to score.")
def check_command(verifier: str, timeout: float, workers: int | None, gold: str, response: str) -> None:
    """Score one response against a gold answer; print the score and its status."""
    with build_verifier(verifier, timeout, workers) as built:
        try:
            built.validate_gold(gold)
        except GoldAnswerError as err:
            raise click.BadParameter(str(err), param_hint="--gold") from err
        outcome = built.evaluate_batch([response], [gold])[0]
    click.echo(f"{outcome.score:g} ({outcome.status.name.lower()})")


@verifiers_group.command("score")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_verifier_options
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as one JSON object.")
def score_command(path: Path, verifier: str, timeout: float, workers: int | None, as_json: bool) -> None:
    """Score a JSONL file of {"response": ..., "gold": ...} rows; print accuracy,
    outcome counts and the share of responses without a \\boxed{} answer."""
    lines, responses, golds = _read_rows(path)
    with build_verifier(verifier, timeout, workers) as built:
        try:
            built.validate_golds(golds)
        except GoldAnswerError as err:
            raise click.ClickException(f"{path}:{lines[err.index or 0]}: {err}") from err
        built.score_batch(responses, golds)
        stats = built.stats
    if as_json:
        click.echo(json.dumps(stats.as_dict()))
        return
    click.echo(f"accuracy: {stats.accuracy:.4f} ({stats.correct}/{stats.total})")
    for key, value in stats.as_dict().items():
        if key not in ("accuracy", "total", "unboxed", "unboxed_share"):
            click.echo(f"{key}: {value}")
    click.echo(f"unboxed: {stats.unboxed} ({stats.unboxed_share:.1%} of responses have no \\boxed{{}} answer)")
    if stats.unboxed_share > UNBOXED_WARNING_SHARE:
        click.echo("note: most responses have no \\boxed{} answer; does the prompt template ask for one?")


def _read_rows(path: Path) -> tuple[list[int], list[str], list[str]]:
    """Line numbers, responses and golds of the non-blank lines of a JSONL file."""
    lines: list[int] = []
    responses: list[str] = []
    golds: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise click.ClickException(f"{path}:{number}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict) or not isinstance(row.get("response"), str) or "gold" not in row:
                raise click.ClickException(
                    f'{path}:{number}: expected an object with a string "response" and a "gold", got {line.strip()[:80]!r}'
                )
            gold = row["gold"]
            if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
                raise click.ClickException(f'{path}:{number}: "gold" must be a string or a number, got {gold!r}')
            lines.append(number)
            responses.append(row["response"])
            golds.append(str(gold))
    if not lines:
        raise click.ClickException(f"{path}: no rows")
    return lines, responses, golds
