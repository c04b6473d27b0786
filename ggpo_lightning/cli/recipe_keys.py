"""Recipe keys that were renamed: in a recipe or on the command line an old key is an error that names its new key;
in a configuration a run saved itself (``<run dir>/config.yaml``) it is migrated, with a warning.

Checked on the raw recipe (every ``--config`` file and every ``--key value`` override)
before LightningCLI parses it, whose own message ("key not expected") would not say
where the setting went.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import yaml

from ggpo_lightning.records.errors import SettingsError

__all__ = ["MOVED_KEYS", "RENAMED_KEYS", "check_renamed_keys", "is_saved_config", "migrate_keys"]

MOVED_KEYS = {
    "model.rollout.mode": "model.rollout.schedule",
    "data.max_staleness": "data.buffer_max_staleness",
    "data.synthetic": "synthetic_data",
}
"""Keys renamed with their value unchanged: old dotted key -> new dotted key (migrated in saved configurations)."""

RENAMED_KEYS = {
    "model.beta": "model.objective.beta",
    "model.clip_eps": "model.objective.clip_eps",
    "model.kl_estimator": "model.objective.kl_estimator",
    "model.eval_max_new_tokens": "model.eval.max_new_tokens",
    "model.eval_temperature": "model.eval.temperature",
    "model.eval_batch_size": "model.eval.batch_size",
    "model.tiny_model": "tiny_model (top level; its task is synthetic_data.task)",
    "model.rollout.mode": "model.rollout.schedule (sync | async; data.mode stays online | offline)",
    "data.max_staleness": "data.buffer_max_staleness (the buffer's drop limit; model.rollout.max_staleness is the "
                          "async producer's bound)",
    "data.synthetic": "synthetic_data (top level, beside tiny_model: the quickstart's builders)",
    "model.rollout.vllm_placement": "model.rollout.engine: vllm_server with model.rollout.servers: local (vLLM in a "
                                    "process of its own is now vLLM's own server)",
    "model.rollout.vllm_devices": "model.rollout.server_devices (the GPUs of model.rollout.servers: local:N)",
}
"""Old key -> new key, as the error says it. ``model.objective: NAME`` became ``model.objective.name: NAME``."""


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {prefix: tree} if prefix else {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _renamed(keys: dict[str, Any], where: str) -> list[str]:
    problems = []
    for old, new in RENAMED_KEYS.items():
        typed = [key for key in keys if key == old or key.startswith(old + ".")]
        if typed:  # a key inside a moved group is named as typed
            problems.append(f"{where}: {old if old in typed else typed[0] + ': ' + old} is now {new}")
    objective = keys.get("model.objective")
    if isinstance(objective, str):
        problems.append(f"{where}: model.objective: {objective} is now model.objective.name: {objective} "
                        "(model.objective groups name, beta, clip_eps and kl_estimator)")
    return problems


def is_saved_config(path: Path) -> bool:
    """True for the ``config.yaml`` that ``ggpo-train`` saved in a run directory (beside its ``metrics.csv``,
    ``summary.json`` or ``checkpoints/``), as opposed to a recipe someone wrote."""
    folder = path.parent
    return path.name == "config.yaml" and any((folder / name).exists()
                                              for name in ("metrics.csv", "summary.json", "checkpoints"))


def migrate_keys(recipe: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``recipe`` with every :data:`MOVED_KEYS` entry moved to its new key, and the moves made (``old -> new``)."""
    moves = []
    for old, new in MOVED_KEYS.items():
        *parents, leaf = old.split(".")
        node = recipe
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = recipe
        for part in new_parents:
            target = target.setdefault(part, {})
        target[new_leaf] = value
        moves.append(f"{old} -> {new}")
    return recipe, moves


def check_renamed_keys(args: list[str]) -> list[str]:
    """``args`` (``ggpo-train``'s command line) with each saved run configuration among its ``--config`` / ``-c``
    files migrated (:func:`migrate_keys`; passed on as YAML text, the file is not rewritten); raise ValueError listing
    every renamed key left in the recipes and overrides, each with its new key and where it was found."""
    problems: list[str] = []
    args = list(args)
    for i, arg in enumerate(args):
        flag, equals, inline = arg.partition("=")  # --config PATH, -c PATH, --config=PATH
        given = inline if equals else (args[i + 1] if i + 1 < len(args) else "")
        if flag in ("--config", "-c") and "\n" not in given and Path(given).is_file():
            path = Path(given)
            recipe = yaml.safe_load(path.read_text()) or {}
            if is_saved_config(path) and isinstance(recipe, dict):
                recipe, moves = migrate_keys(recipe)
                if moves:
                    warnings.warn(f"{path}: a run configuration saved by an earlier version; renamed keys migrated "
                                  f"({', '.join(moves)})", stacklevel=2)
                    migrated = yaml.safe_dump(recipe, sort_keys=False)
                    if equals:
                        args[i] = f"{flag}={migrated}"
                    else:
                        args[i + 1] = migrated
            problems += _renamed(_flatten(recipe), str(path))
        elif arg.startswith("--") and not arg.startswith("--config"):
            key, _, inline = arg[2:].partition("=")
            value = inline if inline else (args[i + 1] if i + 1 < len(args) else None)
            problems += _renamed({key: value}, "command line")
    if problems:
        raise SettingsError("renamed recipe keys (CHANGELOG.md lists them):\n  " + "\n  ".join(problems))
    return args
