"""No function of the package is longer than a reader reads at once: 80 lines from its ``def`` to its last line
(docstring included, decorators not), read from the source's syntax tree."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ggpo_lightning"
MOST_LINES = 80


def long_functions(source: str, most: int = MOST_LINES) -> list[tuple[str, int, int]]:
    """``(name, first line, lines)`` of each function or method of ``source`` longer than ``most`` lines, nested ones
    included."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > most]


def test_no_function_of_the_package_is_over_80_lines():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({lines} lines)"
             for path in files for name, line, lines in long_functions(path.read_text())]
    assert not found, "split these where a reader would:\n" + "\n".join(found)


def test_the_check_finds_a_long_method_and_counts_from_def_to_the_last_line():
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    source = f"class A:\n    @staticmethod\n    def long():\n{body}\n\n    def short():\n        pass\n"
    assert long_functions(source) == [("long", 3, 81)]
    assert long_functions(source, most=81) == []
