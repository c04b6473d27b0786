"""Issue 40, item 7: ``ggpo-train --version``, a ``--help`` that starts with the package's own usage, and a shipped
recipe's name given to ``--config`` (through ``train_main``, the console script's entry)."""

from __future__ import annotations

import pytest

from ggpo_lightning import __version__
from ggpo_lightning.cli.errors import USER_ERROR_EXIT
from ggpo_lightning.cli.train import train_main


def exit_of(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        train_main(list(args))
    captured = capsys.readouterr()
    return stop.value.code, captured.out, captured.err


def test_version(capsys):
    assert exit_of(capsys, "--version") == (0, f"ggpo-train {__version__}\n", "")


def test_help_starts_with_the_usage_and_the_recipes(capsys):
    code, out, _ = exit_of(capsys, "--help")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "usage: ggpo-train --config RECIPE.yaml [--config OVERLAY.yaml ...] [--KEY VALUE ...]"
    head = "\n".join(lines[:12])
    assert "ggpo-train --config recipes/quickstart.yaml" in head and "ggpo recipes list" in head
    assert "--trainer.max_steps" in out  # Lightning's keys follow


@pytest.mark.parametrize("given,name,file", [("quickstart", "quickstart", "quickstart.yaml"),
                                             ("baselines/grpo.yaml", "baselines/grpo", "grpo.yaml")])
def test_a_shipped_recipe_name_as_config_says_how_to_copy_it(capsys, tmp_path, monkeypatch, given, name, file):
    monkeypatch.chdir(tmp_path)
    code, _, err = exit_of(capsys, "--config", given)
    assert code == USER_ERROR_EXIT
    assert err.splitlines()[0] == (f"ggpo-train: error: --config {given}: no such file; {name!r} is a shipped recipe: "
                                   f"`ggpo recipes copy {name}` writes it to {file} here, to pass to --config "
                                   "(`ggpo recipes list` shows them all)")


def test_a_missing_config_file_is_named(capsys, tmp_path):
    code, _, err = exit_of(capsys, "--config", str(tmp_path / "mine.yaml"))
    assert code == USER_ERROR_EXIT and err.splitlines()[0] == f"ggpo-train: error: --config {tmp_path}/mine.yaml: no such file"
