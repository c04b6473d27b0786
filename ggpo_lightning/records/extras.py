"""The optional packages behind the package's extras (``pip install 'ggpo-lightning[EXTRA]'``), checked before the
work that needs them: a missing one is one line naming the package, what needs it and the install command."""

from __future__ import annotations

import importlib.util

from ggpo_lightning.records.errors import UserError

__all__ = ["EXTRAS", "MissingPackageError", "installed", "require"]

EXTRAS = {"peft": "lora", "wandb": "wandb", "tensorboard": "tensorboard", "pyarrow": "data", "datasets": "data",
          "matplotlib": "plot"}
"""Optional package -> the extra of ``pyproject.toml`` that installs it."""


class MissingPackageError(UserError, ImportError):
    """An optional package the settings need is not installed (the message names it and the install command)."""


def installed(package: str) -> bool:
    """Whether ``package`` (a top-level import name) can be imported here, without importing it."""
    return importlib.util.find_spec(package) is not None


def require(package: str, needed_for: str) -> None:
    """Raise :class:`MissingPackageError` when ``package`` (a key of :data:`EXTRAS`) is not installed:
    ``NEEDED_FOR needs PACKAGE, which is not installed: pip install 'ggpo-lightning[EXTRA]'``."""
    if not installed(package):
        raise MissingPackageError(f"{needed_for} needs {package}, which is not installed: "
                                  f"pip install 'ggpo-lightning[{EXTRAS[package]}]'")
