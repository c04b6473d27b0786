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
from typing import Any

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


def explain_parse_error(text: str, keys: Iterable[str]) -> str:
    """One line for jsonargparse's error ``text``: ``unknown key K; did you mean V?`` (the closest of ``keys``,
    :func:`known_keys`, or of the fields of the class the key belongs to) or ``K: expected a float, got 'abc'``.
    Falls back to the report's first line."""
    unknown = re.search(r"Option '([^']+)' is not accepted", text)
    groups = re.findall(r'Parser key "([^"]+)"', text)  # outermost first: model.objective, then beta
    if unknown and groups:
        keys, group, name = list(keys), ".".join(groups), unknown.group(1)
        # a nested group is reported by its own name (sampling): the known key that ends with it is the full one
        group = next((k for k in keys if k == group), None) or next((k for k in keys if k.endswith(f".{group}")),
                                                                     group)
        class_path = re.search(r"given class_path '([^']+)'", text)
        parameters = _parameters(class_path.group(1)) if class_path else []
        return _unknown(f"{group}.{name}", [f"{group}.{p}" for p in parameters] + list(keys))
    unrecognized = re.search(r"nrecognized arguments: (--[^\s=]+)", text)
    if unrecognized:
        name = unrecognized.group(1)[2:]
        return _unknown(".".join([*groups[:1], name]), list(keys))  # nested: relative to the group's key
    expected = re.search(r"Expected a (.+?)(?:\. Got value: (.*))?$", text, re.MULTILINE)
    if groups and expected:
        wanted = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", expected.group(1))
        got = f", got {expected.group(2)!r}" if expected.group(2) is not None else ""
        return f"{'.'.join(groups)}: expected {wanted}{got}"
    return text.strip().splitlines()[0] if text.strip() else "invalid command line"


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
