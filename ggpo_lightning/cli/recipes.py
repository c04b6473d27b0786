"""``ggpo recipes list|copy``: the recipes that ship with the package (also after a wheel install, where there is
no repository folder to read them from)."""

from __future__ import annotations

import shutil
from importlib.resources import files
from pathlib import Path

import click

__all__ = ["recipe_files", "recipes_group"]


def recipe_files() -> dict[str, Path]:
    """Recipe name (``qwen3-1.7b-math``, ``baselines/grpo``, ``loggers/wandb``) -> its YAML file, from the installed
    package (``ggpo_lightning.recipes``)."""
    root = Path(str(files("ggpo_lightning.recipes")))
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in sorted(root.rglob("*.yaml"))}


def _summary(path: Path) -> str:
    """The recipe's first comment line (what it is for)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


@click.group(name="recipes")
def recipes_group() -> None:
    """The recipes that ship with ggpo-lightning (base recipes and overlays)."""


@recipes_group.command("list")
def list_command() -> None:
    """List the recipes: name and what each is for."""
    recipes = recipe_files()
    width = max(map(len, recipes))
    for name, path in recipes.items():
        click.echo(f"{name:<{width}}  {_summary(path)}")


@recipes_group.command("copy")
@click.argument("name")
@click.argument("dest", required=False, type=click.Path(path_type=Path))
def copy_command(name: str, dest: Path | None) -> None:
    """Copy recipe NAME (as `ggpo recipes list` shows it) to DEST (a file, or a folder; default: NAME's file name in
    the current folder), to edit and pass to ggpo-train --config. An existing file is not overwritten."""
    recipes = recipe_files()
    source = recipes.get(name.removesuffix(".yaml"))
    if source is None:
        raise click.BadParameter(f"no recipe {name!r}; `ggpo recipes list` shows them", param_hint="NAME")
    target = dest or Path(source.name)
    if target.is_dir():
        target = target / source.name
    if target.exists():
        raise click.ClickException(f"{target} exists; give another DEST or remove it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    click.echo(f"{name} -> {target}")
