"""``ggpo-train``'s command-line mistakes in one line: an unknown key with the closest valid one, a bad value with
the key it was given to (jsonargparse's own report spans dozens of lines of usage and union subtypes)."""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import typing
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["explain_parse_error", "known_keys"]

HELP = "ggpo-train --help lists every key"


def known_keys(parser: Any) -> list[str]:
    """Every key of ``parser`` (a jsonargparse parser): its ``--key`` options and, under an option typed as a
    dataclass (``model.objective``), that dataclass's fields, nested ones included (``model.rollout.sampling.top_p``)."""
    keys = []
    for option, action in parser._option_string_actions.items():  # noqa: SLF001 (jsonargparse has no public list)
        if option.startswith("--") and not option.endswith(".help"):  # --model.rollout.help: a help action
            keys += _with_fields(option[2:], getattr(action, "_typehint", None))
    return keys


def _with_fields(key: str, hint: Any) -> list[str]:
    keys = [key]
    for kind in (hint, *typing.get_args(hint)):
        if is_dataclass(kind):
            hints = typing.get_type_hints(kind)
            keys += [k for f in fields(kind) for k in _with_fields(f"{key}.{f.name}", hints.get(f.name))]
    return keys


def explain_parse_error(text: str, keys: Iterable[str], config_files: Iterable[str] = ()) -> str:
    """One line for jsonargparse's error ``text``: ``unknown key K; did you mean V?`` (the closest of ``keys``,
    :func:`known_keys`, or of the parameters of the class the key belongs to), prefixed with ``FILE:LINE:`` when one
    of ``config_files`` (the ``--config`` recipes) holds the key, or ``K: expected a float, got 'abc'``. Falls back
    to the report's first line."""
    keys = list(keys)
    unknown = _unknown_key(text, keys)
    if unknown is not None:
        key, candidates = unknown
        where = next(filter(None, (_line_of(key, Path(f)) for f in config_files)), None)
        return (f"{where}: " if where else "") + _unknown(key, candidates)
    groups = re.findall(r'Parser key "([^"]+)"', text)
    expected = re.search(r"Expected a (.+?)(?:\. Got value: (.*))?$", text, re.MULTILINE)
    if groups and expected:
        wanted = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", expected.group(1))
        got = f", got {expected.group(2)!r}" if expected.group(2) is not None else ""
        return f"{'.'.join(groups)}: expected {wanted}{got}"
    return text.strip().splitlines()[0] if text.strip() else "invalid command line"


def _unknown_key(text: str, keys: list[str]) -> tuple[str, list[str]] | None:
    """``(the full dotted key, the candidates to suggest)`` when ``text`` reports a key that is not accepted:
    ``Option 'X' is not accepted`` or ``Group 'G' does not accept option 'X'`` (a recipe file's key; under the
    ``Parser key`` groups it is nested in) or ``Unrecognized arguments: --X`` (the command line's)."""
    groups = re.findall(r'Parser key "([^"]+)"', text)  # outermost first: model.objective, then beta
    option = re.search(r"Option '([^']+)' is not accepted", text)
    in_group = re.search(r"Group '([^']+)' does not accept option '([^']+)'", text)
    if option or in_group:
        name = option.group(1) if option else in_group.group(2)
        # a group nested in a Parser key (model.rollout, then sampling) is named relative to it
        nested = bool(in_group and groups and in_group.group(1) not in groups)
        group = ".".join(groups + ([in_group.group(1)] if nested or (in_group and not groups) else []))
        if group:  # a nested group reported by its own name (sampling): the known key that ends with it is the full one
            group = next((k for k in keys if k == group), None) or next(
                (k for k in keys if k.endswith(f".{group}")), group)
        class_path = re.search(r"class_path[= ]'([^']+)'", text)
        if class_path and not nested:  # a class's parameters; a class_path value (model.optimizer): its init_args
            group += ".init_args" if "init_args" in text else ""
            return f"{group}.{name}", [f"{group}.{p}" for p in _parameters(class_path.group(1))] + keys
        return (f"{group}.{name}" if group else name), keys
    unrecognized = re.search(r"nrecognized arguments: (--[^\s=]+)", text)
    if unrecognized:  # nested: relative to the group's key
        return ".".join([*groups[:1], unrecognized.group(1)[2:]]), keys
    return None


def _line_of(key: str, path: Path) -> str | None:
    """``FILE:LINE`` of dotted ``key`` in the YAML file ``path``; None when the file does not hold it (or is no
    readable YAML: the parser reported on it already)."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if match is None:
            return None
        line, node = match[0].start_mark.line + 1, match[1]
    return f"{path}:{line}"


def _unknown(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f"unknown key {key}" + (f"; did you mean {close[0]}?" if close else "") + f" ({HELP})"


def _parameters(class_path: str) -> list[str]:
    """The constructor parameters of ``class_path`` (the keys a recipe group accepts); empty when not importable."""
    module, _, name = class_path.rpartition(".")
    try:
        return list(inspect.signature(getattr(importlib.import_module(module), name)).parameters)
    except (ImportError, AttributeError, ValueError, TypeError):
        return []
