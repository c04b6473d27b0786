"""Find verifiers by name: built-ins, ``@register_verifier`` classes and plugins.

Third-party packages make a verifier available by declaring an entry point::

    [project.entry-points."ggpo.verifiers"]
    mychecker = "my_package.module:MyVerifier"

A recipe then names it ``verifier: mychecker`` or, with arguments, as a spec
``{"class_path": "mychecker" or "my_package.module.MyVerifier", "init_args": {...}}``.
Names registered in-process win over entry points of the same name. Entry points are
read on each lookup, so packages installed (or put on ``sys.path``) at run time are seen.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar, Union

from ggpo_verifiers.base import Verifier

ENTRY_POINT_GROUP = "ggpo.verifiers"

VerifierSpec = Union[str, Mapping[str, Any], Verifier]
"""A registry name, a dotted class path, a ``{"class_path", "init_args"}`` mapping or an
already-built verifier."""

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_REGISTRY: dict[str, type[Verifier]] = {}
V = TypeVar("V", bound=type[Verifier])


class UnknownVerifierError(LookupError):
    """No verifier is registered or installed under the requested name."""


def register_verifier(name: str) -> Callable[[V], V]:
    """Class decorator: make a ``Verifier`` subclass available as ``name``."""
    if not _NAME_RE.match(name):
        raise ValueError(f"verifier name {name!r} must be a letter followed by letters, digits, '_' or '-'")

    def decorate(cls: V) -> V:
        if not (isinstance(cls, type) and issubclass(cls, Verifier)):
            raise TypeError(f"@register_verifier({name!r}) decorates {cls!r}, which is not a Verifier subclass")
        if _REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"verifier name {name!r} is already registered to {_qualname(_REGISTRY[name])}")
        _REGISTRY[name] = cls
        if not cls.__dict__.get("name"):
            cls.name = name
        return cls

    return decorate


def available_verifiers() -> dict[str, str]:
    """Every verifier name mapped to where it comes from (``module:Class``), sorted."""
    found = {ep.name: ep.value for ep in _entry_points().values()}
    found.update({name: _qualname(cls) for name, cls in _REGISTRY.items()})
    return dict(sorted(found.items()))


def verifier_class(name_or_path: str) -> type[Verifier]:
    """The class registered as ``name_or_path``, or at the dotted path ``pkg.mod.Cls``
    (``pkg.mod:Cls`` also works)."""
    if name_or_path in _REGISTRY:
        return _REGISTRY[name_or_path]
    plugin = _entry_points().get(name_or_path)
    if plugin is not None:
        cls = _checked(plugin.load(), f"entry point {name_or_path!r} ({plugin.value})")
        if not cls.__dict__.get("name"):
            cls.name = name_or_path
        return cls
    if "." in name_or_path or ":" in name_or_path:
        module, _, attr = name_or_path.replace(":", ".").rpartition(".")
        return _checked(getattr(importlib.import_module(module), attr), f"class path {name_or_path!r}")
    raise UnknownVerifierError(
        f"unknown verifier {name_or_path!r}; available: {', '.join(available_verifiers()) or 'none'}. "
        f"Give a registered name, a class path like 'my_package.module.MyVerifier', or install "
        f"a package declaring an entry point in the group {ENTRY_POINT_GROUP!r}."
    )


def get_verifier(name_or_spec: VerifierSpec, **kwargs: Any) -> Verifier:
    """Build a verifier from a name, a class path or a ``class_path``/``init_args`` spec.

    ``kwargs`` are constructor arguments; they override the spec's ``init_args``. A
    ``Verifier`` instance is returned as is (no ``kwargs`` allowed then).
    """
    if isinstance(name_or_spec, Verifier):
        if kwargs:
            raise TypeError(f"get_verifier got a built verifier and arguments {sorted(kwargs)}; pass one or the other")
        return name_or_spec
    if isinstance(name_or_spec, str):
        return verifier_class(name_or_spec)(**kwargs)
    if isinstance(name_or_spec, Mapping):
        unknown = set(name_or_spec) - {"class_path", "init_args"}
        if "class_path" not in name_or_spec or unknown:
            raise ValueError(
                f"a verifier spec needs 'class_path' and optionally 'init_args', got keys {sorted(name_or_spec)}"
            )
        init_args = dict(name_or_spec.get("init_args") or {})
        return verifier_class(name_or_spec["class_path"])(**{**init_args, **kwargs})
    raise TypeError(f"cannot build a verifier from a {type(name_or_spec).__name__}; give a name or a spec")


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)  # first on sys.path wins, as for imports
    return found


def _checked(obj: object, source: str) -> type[Verifier]:
    if isinstance(obj, type) and issubclass(obj, Verifier) and not getattr(obj, "__abstractmethods__", None):
        return obj
    raise TypeError(f"{source} is {obj!r}, not a concrete ggpo_verifiers.Verifier subclass")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
