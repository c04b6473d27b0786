"""Copy math-verify's regression cases, as data, from a checkout of its repository.

Not a test: run by hand when the pinned commit changes, then commit the JSON it writes.

    python tests/verifiers/upstream/extract_cases.py GIT_DIR [COMMIT] > tests/verifiers/upstream/math_verify_cases.json

``GIT_DIR`` is a (bare) git directory of https://github.com/huggingface/Math-Verify.
Every ``(gold, pred, expected)`` triple of its tests is kept with the test that holds it
and the settings that test passes to math-verify (``match_types``, ``precision``,
``strict``, ``allow_set_relation_comp``): the parametrized cases of tests whose body
calls ``compare_strings(gold, pred, ...)`` or ``verify(parse(gold), parse(pred))``, and
``compare_strings`` calls with literal arguments. Rows repeated verbatim in one test are
kept once. Tests of math-verify's API (timeouts,
configs, string extraction, error propagation) hold no such triples and give none.

The source files are parsed with ``ast``, never imported. Values are literals except one
f-string of ``math.sqrt``, evaluated with only ``math`` in scope.
"""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from typing import Any

DEFAULTS = {"match_types": ["latex", "expr"], "precision": 6, "strict": True, "allow_set_relation_comp": False}
# compare_strings' parameters, in order (tests/test_all.py).
PARAMS = ("gold", "pred", "match_types", "precision", "strict", "allow_set_relation_comp")
RESULT_NAMES = ("expected", "result")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def value(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:  # f"{math.sqrt(17):.15f}": trusted upstream test source
        return eval(compile(ast.Expression(node), "<case>", "eval"), {"__builtins__": {}, "math": math})


def call_settings(call: ast.Call) -> dict[str, ast.AST]:
    """compare_strings' arguments as parameter name -> AST node."""
    args = dict(zip(PARAMS, call.args))
    args.update({kw.arg: kw.value for kw in call.keywords})
    return args


def resolve(node: ast.AST, row: dict[str, Any]) -> Any:
    return row[node.id] if isinstance(node, ast.Name) and node.id in row else value(node)


def oracle_call(func: ast.FunctionDef) -> tuple[str, ast.Call] | None:
    """The compare_strings(...) or verify(parse(..), parse(..)) call in a test body."""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "compare_strings":
                return "compare_strings", node
            if node.func.id == "verify" and all(isinstance(a, ast.Call) for a in node.args[:2]):
                return "verify", node
    return None


def cases_of(path: str, source: str) -> list[dict[str, Any]]:
    cases = []
    for func in ast.parse(source).body:
        if not isinstance(func, ast.FunctionDef) or not func.name.startswith("test_"):
            continue
        found = oracle_call(func)
        if found is None:
            continue
        kind, call = found
        where = f"{path}::{func.name}"
        for deco in func.decorator_list:
            if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "pytest.mark.parametrize":
                names = [name.strip() for name in value(deco.args[0]).split(",")]
                for row_node in deco.args[1].elts:
                    row = dict(zip(names, (value(item) for item in row_node.elts)))
                    cases.append(case(where, kind, call, row))
        if not func.decorator_list and kind == "compare_strings":
            for node in ast.walk(func):  # assert compare_strings(<literals>) == 1
                if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
                    row = {"expected": value(node.comparators[0])}
                    cases.append(case(where, kind, node.left, row))
    return cases


def case(where: str, kind: str, call: ast.Call, row: dict[str, Any]) -> dict[str, Any]:
    expected = next(row[name] for name in RESULT_NAMES if name in row)
    settings = dict(DEFAULTS)
    if kind == "compare_strings":
        args = call_settings(call)
        gold, pred = resolve(args.pop("gold"), row), resolve(args.pop("pred"), row)
        settings.update({name: resolve(node, row) for name, node in args.items()})
        settings["boxed_priority_first"] = True  # compare_strings: LatexExtractionConfig(boxed_match_priority=0)
    else:
        gold, pred = row["gold"], row["pred"]
        settings["boxed_priority_first"] = False  # parse's default configs
    return {"source": where, "gold": gold, "pred": pred, "expected": bool(expected), "settings": settings}


def main(git_dir: str, commit: str = "HEAD") -> None:
    commit = git(git_dir, "rev-parse", commit).strip()
    paths = [p for p in git(git_dir, "ls-tree", "-r", "--name-only", commit, "tests/").split() if p.endswith(".py")]
    cases = [c for path in sorted(paths) for c in cases_of(path, git(git_dir, "show", f"{commit}:{path}"))]
    unique = {json.dumps(c, sort_keys=True): c for c in cases}  # some rows are repeated verbatim
    json.dump(
        {"repository": "https://github.com/huggingface/Math-Verify", "commit": commit, "cases": list(unique.values())},
        sys.stdout,
        indent=1,
        ensure_ascii=False,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
