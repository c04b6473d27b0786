"""``ggpo_verifiers`` imports without torch, lightning or the math stack, and every
module of it imports."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import ggpo_verifiers


def test_import_is_light() -> None:
    code = (
        "import sys, ggpo_verifiers, ggpo_verifiers.cli\n"
        "heavy = ('torch', 'lightning', 'transformers', 'sympy', 'math_verify')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_module_imports() -> None:
    names = [m.name for m in pkgutil.walk_packages(ggpo_verifiers.__path__, "ggpo_verifiers.")]
    assert {"ggpo_verifiers.pool", "ggpo_verifiers.worker", "ggpo_verifiers.equivalence"} <= set(names)
    for name in names:
        importlib.import_module(name)
