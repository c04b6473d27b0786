"""``ggpo_verifiers`` imports without torch, lightning or the math stack, every module of
it imports, its modules form no import cycle, and none imports the trainer."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

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


def _package_imports() -> dict[str, set[str]]:
    """Each module of ``ggpo_verifiers`` -> the package modules it imports, anywhere in
    its code (imports inside functions count: a deferred import is still a dependency)."""
    root = Path(ggpo_verifiers.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[f"ggpo_verifiers.{path.stem}"] = imported
    return graph


def test_modules_import_each_other_without_cycles() -> None:
    graph = _package_imports()
    assert {"ggpo_verifiers.base", "ggpo_verifiers.pool", "ggpo_verifiers.records"} <= set(graph)
    edges = {module: {dep for dep in deps if dep in graph and dep != module} for module, deps in graph.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for dep in sorted(edges[module]):
                visit(dep, (*path, module))
            done.add(module)

    for module in sorted(edges):
        visit(module, ())


def test_imports_nothing_of_the_trainer() -> None:
    for module, deps in _package_imports().items():
        assert not {dep for dep in deps if dep.split(".")[0] == "ggpo_lightning"}, module
