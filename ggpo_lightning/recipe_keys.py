"""Recipe keys that were renamed: an old key is an error that names its new key.

Checked on the raw recipe (every ``--config`` file and every ``--key value`` override)
before LightningCLI parses it, whose own message ("key not expected") would not say
where the setting went.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["RENAMED_KEYS", "check_renamed_keys"]

RENAMED_KEYS = {
    "model.beta": "model.objective.beta",
    "model.clip_eps": "model.objective.clip_eps",
    "model.kl_estimator": "model.objective.kl_estimator",
    "model.eval_max_new_tokens": "model.eval.max_new_tokens",
    "model.eval_temperature": "model.eval.temperature",
    "model.eval_batch_size": "model.eval.batch_size",
    "model.tiny_model": "tiny_model (top level; its task is data.synthetic.task)",
}
"""Old key -> new key. ``model.objective: NAME`` became ``model.objective.name: NAME``."""


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {prefix: tree} if prefix else {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _renamed(keys: dict[str, Any], where: str) -> list[str]:
    problems = [f"{where}: {old} is now {new}" for old, new in RENAMED_KEYS.items() if old in keys]
    objective = keys.get("model.objective")
    if isinstance(objective, str):
        problems.append(f"{where}: model.objective: {objective} is now model.objective.name: {objective} "
                        "(model.objective groups name, beta, clip_eps and kl_estimator)")
    return problems


def check_renamed_keys(args: list[str]) -> None:
    """Raise ValueError listing every renamed key in ``args`` (``ggpo-train``'s command line) and in the
    ``--config`` files it names, each with its new key and where it was found."""
    problems: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args) and Path(args[i + 1]).is_file():
            recipe = yaml.safe_load(Path(args[i + 1]).read_text()) or {}
            problems += _renamed(_flatten(recipe), args[i + 1])
        elif arg.startswith("--") and not arg.startswith("--config"):
            key, _, inline = arg[2:].partition("=")
            value = inline if inline else (args[i + 1] if i + 1 < len(args) else None)
            problems += _renamed({key: value}, "command line")
    if problems:
        raise ValueError("renamed recipe keys (CHANGELOG.md lists them):\n  " + "\n  ".join(problems))
