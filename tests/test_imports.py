"""Every module imports with the base dependencies; the top-level package stays light."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import ggpo_lightning


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(ggpo_lightning.__path__, "ggpo_lightning.")]
    assert "ggpo_lightning.objectives" in names and "ggpo_lightning.cli" in names
    for name in names:
        importlib.import_module(name)


def test_package_and_cli_import_without_torch():
    code = ("import sys, ggpo_lightning, ggpo_lightning.cli; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
