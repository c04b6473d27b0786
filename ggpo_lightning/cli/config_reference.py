"""The configuration reference: every key ``ggpo-train`` reads, with its type, default and meaning, taken from the
code that defines it, so the documentation site's page cannot drift from the recipes the trainer accepts.

The keys come from ``ggpo-train``'s own parser (the one a recipe is checked against). A key whose type is a settings
dataclass (``model.rollout``, ``model.objective``, ``tiny_model``, ...) is opened into one key per field, recursively;
a field's meaning is its attribute docstring (the string literal under it), the convention of every settings
dataclass in the package. A key whose value names a class (``class_path`` and ``init_args``: ``trainer.logger``,
``model.optimizer``) is listed once: its ``init_args`` are the named class's own arguments.

``docs/gen_config_reference.py`` writes the page at build time; ``tests/docs/`` checks that every key has a meaning
and that every key of the quickstart's ``--print_config`` is listed."""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigKey", "GROUPS", "config_keys", "reference_markdown", "train_parser"]

GROUPS = {
    "": "Top-level keys",
    "model": "model.*: the learner, its objective and its rollouts (GGPOModule)",
    "data": "data.*: prompts and the behavior buffer (PromptGroupDataModule)",
    "summary": "summary.*: summary.json and the final export",
    "samples": "samples.*: sample completions in samples.jsonl and the logger",
    "checkpoint": "checkpoint.*: when checkpoints are written (Lightning's ModelCheckpoint)",
    "tiny_model": "tiny_model.*: the tiny CPU model the quickstart builds",
    "synthetic_data": "synthetic_data.*: the synthetic task the quickstart builds",
    "trainer": "trainer.*: Lightning's Trainer",
}
"""The reference's sections, in order: a key's section is its first component (or the top level)."""

OWN_GROUPS = ("", "model", "data", "summary", "samples", "tiny_model", "synthetic_data")
"""The sections whose keys this package defines (the others are Lightning's: their meanings are its docstrings)."""


@dataclass(frozen=True)
class ConfigKey:
    """One key of a ``ggpo-train`` recipe."""

    key: str
    """Its dotted name, as on the command line without ``--`` (``model.rollout.k``)."""
    type: str
    """Its type, written as in Python without module paths (``int | None``)."""
    default: Any
    """Its default (a recipe may set another)."""
    doc: str
    """What it means: the field's docstring, or the parser's help (empty when the code says nothing)."""
    takes_class: bool = False
    """Whether its value names a class (``class_path``, ``init_args``): its ``init_args`` are that class's."""

    @property
    def group(self) -> str:
        """The key's section in :data:`GROUPS`."""
        head = self.key.split(".", 1)[0]
        return head if "." in self.key and head in GROUPS else ""


class _ParserBuilt(Exception):
    def __init__(self, parser: Any) -> None:
        super().__init__("parser built")
        self.parser = parser


def train_parser() -> Any:
    """``ggpo-train``'s argument parser, built as a run builds it (without parsing a command line)."""
    from ggpo_lightning.cli.train import TRAINER_DEFAULTS, GGPOTrainCLI, GGPOModule, PromptGroupDataModule

    class ParserOnly(GGPOTrainCLI):
        def parse_arguments(self, parser, args):
            raise _ParserBuilt(parser)

    try:
        ParserOnly(GGPOModule, PromptGroupDataModule, run=False, auto_configure_optimizers=False,
                   trainer_defaults=TRAINER_DEFAULTS, parser_kwargs={"exit_on_error": False}, args=[])
    except _ParserBuilt as built:
        return built.parser
    raise RuntimeError("GGPOTrainCLI built no parser")  # pragma: no cover: LightningCLI always parses


def config_keys() -> list[ConfigKey]:
    """Every key of a ``ggpo-train`` recipe, in the parser's order, settings dataclasses opened field by field."""
    keys: list[ConfigKey] = []
    for action in train_parser()._actions:
        hint = getattr(action, "_typehint", None)
        if hint is None or action.dest in ("config", "print_config", "version") or action.dest.endswith(".help"):
            continue
        keys += _keys_of(action.dest, hint, action.default, _clean(action.help or ""))
    return keys


def _keys_of(key: str, hint: Any, default: Any, doc: str) -> list[ConfigKey]:
    settings = _settings_classes(hint)
    takes_class = not settings and _takes_class(hint)
    found = [ConfigKey(key, _type_name(hint), _plain_default(default), doc, takes_class)]
    for settings in settings:  # each of a union's settings classes (tiny_model.task: ArithmeticTask | SynthMathTask)
        field_docs = _field_docs(settings)
        hints = typing.get_type_hints(settings)
        for f in dataclasses.fields(settings):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = None
            named = {k.key for k in found}
            found += [k for k in _keys_of(f"{key}.{f.name}", hints[f.name], value, field_docs.get(f.name, ""))
                      if k.key not in named]
    return found


def _members(hint: Any) -> tuple:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _settings_classes(hint: Any) -> list[type]:
    """The settings dataclasses a key's type holds (``RolloutConfig | None``: ``[RolloutConfig]``)."""
    return [m for m in _members(hint) if isinstance(m, type) and dataclasses.is_dataclass(m)]


def _takes_class(hint: Any) -> bool:
    """Whether a key's value can name a class: a type that is a class the package does not open itself (a logger,
    a strategy, an optimizer factory), or a list of them."""
    for member in _members(hint):
        origin = typing.get_origin(member)
        if origin is collections.abc.Callable:
            return True
        if origin in (list, typing.Union, types.UnionType):
            if origin is not list or any(_takes_class(a) for a in typing.get_args(member)):
                return True
        elif isinstance(member, type) and member.__module__.split(".")[0] not in ("builtins", "pathlib", "datetime"):
            return True
    return False


def _field_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring (the string literal under it), from ``cls`` and its bases."""
    import ast

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip())
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = _clean(inspect.cleandoc(after.value.value))
    return docs


def _clean(text: str) -> str:
    """A docstring as one Markdown paragraph: Sphinx roles to their target's last name, one line."""
    text = re.sub(r":(?:class|func|mod|meth|attr|data|obj|exc):`~([\w.]*\.)?(\w+)`", r"``\2``", text)
    text = re.sub(r":(?:class|func|mod|meth|attr|data|obj|exc):`([\w.]+)`", r"``\1``", text)
    return " ".join(text.split())


def _type_name(hint: Any) -> str:
    name = hint.__name__ if isinstance(hint, type) and not typing.get_args(hint) else str(hint)
    name = name.replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"\b(?:[a-z_][\w]*\.)+([A-Za-z_]\w*)", r"\1", name)


def _plain_default(value: Any) -> Any:
    if isinstance(value, argparse.Namespace) or type(value).__name__ == "Namespace":
        return {k: _plain_default(v) for k, v in vars(value).items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__qualname__", repr(value))
    return value


def _default_text(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict) and "class_path" in value:
        return f"`{value['class_path']}`"
    if isinstance(value, (dict, list)) and len(str(value)) > 40:
        return "(the fields below)" if isinstance(value, dict) else "(a list)"
    if value == "==SUPPRESS==" or value is inspect.Parameter.empty:
        return "(required)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """The configuration reference as a Markdown page: a table per section (:data:`GROUPS`)."""
    keys = config_keys()
    lines = [
        "# Configuration reference",
        "",
        "Every key a `ggpo-train` recipe can set, with its type, its default and what it means, generated from the",
        "code when the site is built (`ggpo_lightning/cli/config_reference.py`): the settings classes' docstrings and",
        "`ggpo-train`'s own parser. A recipe sets a key in YAML (`model: {rollout: {k: 8}}`) or on the command line",
        "after it (`--model.rollout.k 8`); `ggpo-train --config RECIPE.yaml --print_config` prints a recipe with every",
        "key resolved. A key marked *class* takes `class_path` and `init_args`: its `init_args` are the arguments of",
        "the class it names (for example `lightning.pytorch.loggers.CSVLogger`'s `save_dir` and `name`).",
        "",
    ]
    for group, title in GROUPS.items():
        members = [k for k in keys if k.group == group]
        if not members:
            continue
        head, _, rest = title.partition(": ")
        lines += [f"## {head}", ""] + ([rest[:1].upper() + rest[1:] + ".", ""] if rest else [])
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for k in members:
            kind = f"`{_cell(k.type)}`" + (" (*class*)" if k.takes_class else "")
            lines.append(f"| `{k.key}` | {kind} | {_cell(_default_text(k.default))} | {_cell(k.doc) or '—'} |")
        lines.append("")
    return "\n".join(lines)
