"""The ``math`` verifier on math-verify's own regression cases: a corpus nobody here wrote.

``upstream/math_verify_cases.json`` holds every (gold, prediction, expected) triple of
the test files of huggingface/Math-Verify at a pinned commit (see ``upstream/README.md``),
each with its source test and the settings that test gives math-verify. Each case is
scored three ways, in one batch each:

* math-verify with the case's own settings: must give ``expected`` on every case (the
  copy is faithful and the installed math-verify passes its own tests);
* math-verify as the trainer would call it, ``verify(parse(gold), parse(pred))`` with
  its defaults; a case whose verdict changes with the settings (or that appears twice
  with different settings and expected values) is **config-dependent** and counted
  apart;
* the ``math`` verifier, ``score(response=pred, gold=gold)``.

Every case where the verifier's verdict differs from ``expected`` must be listed in
``DELIBERATE`` with its reason (and every listed case must still differ); the verifier
must agree on at least ``MIN_AGREEMENT`` of the cases that are not config-dependent, and
must never score 1 where ``expected`` is 0 unless math-verify with its defaults does too.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

CORPUS = Path(__file__).parent / "upstream" / "math_verify_cases.json"
PINNED_COMMIT = "5d148cfaaf99214c2e4ffb4bc497ab042c592a7a"
MIN_AGREEMENT = 0.96

ALL = "tests/test_all.py::"
COMMA_DECIMAL = "a comma is never a decimal mark (README 'Policies'): it separates list elements or groups thousands"
PRECISION = "config: the case compares floats to fewer decimals (precision < 6); the verifier's float_rounding is 6"
LATEX_ONLY = (
    "config: the case extracts LaTeX only, so math-verify misses the 9 in a $...$ split over lines; "
    "with both extraction configs (math-verify's default, and the verifier's) the 9 is found"
)

# (source test, gold, pred, expected) -> why the verifier's verdict differs from `expected`.
DELIBERATE: dict[tuple[str, str, str, bool], str] = {
    (ALL + "test_number_extraction", "1000.99", "1000,99", True): COMMA_DECIMAL,
    (ALL + "test_number_extraction", "1,22", "1.22", True): COMMA_DECIMAL,
    (ALL + "test_number_extraction", "2.74", "Soucis : 2,74 $ a..", True): COMMA_DECIMAL,
    (ALL + "test_number_extraction", "0,111", "0.111", True): COMMA_DECIMAL,
    (ALL + "test_latex_notation", "$9$", "Answer $ \n 9 \n $", False): LATEX_ONLY,
    (ALL + "test_latex_notation", "$9$", "Answer \\( \n 9 \n \\)", False): LATEX_ONLY,
    (ALL + "test_precision", "$\\frac{1}{3}$", "0.3333$", True): PRECISION,
    (
        ALL + "test_complex_math_expressions",
        "$(\\begin{pmatrix}\\frac{1}{3}\\\\ \\frac{1}{5} \\end{pmatrix})$",
        "$\\begin{pmatrix}0.33\\\\0.2 \\end{pmatrix}$",
        True,
    ): PRECISION,
    (ALL + "test_complex_math_expressions", "$(\\frac{3}{5},\\frac{8}{3}]$", "$(0.6,2.6667]$", True): PRECISION,
    (
        "tests/test_numina_cases.py::test_numina_cases",
        "\\\\boxed{W(n) = 1 \\\\text{ and } W(n) = -1",
        "W(x)=1orW(x)=-1",
        True,
    ): (
        "the gold's last \\boxed{ is never closed: gold_from_solution reports the row as unusable "
        "(GoldAnswerError at load time) where math-verify takes the rest of the text as the answer"
    ),
    (
        "tests/test_open_thoughts.py::test_open_thoughts",
        "$$x = \\frac{1}{2}, x = \\frac{-1 \\pm \\sqrt{13}}{4}$$",
        "$$\\boxed{x = \\frac{1}{2}, x = \\frac{-1 \\pm \\sqrt{13}}{4}}$$",
        True,
    ): (
        "the gold does not parse (the LaTeX parser stops at \\pm inside a list): the verifier reports it "
        "as unusable; math-verify compares the unparsed strings, so only a verbatim copy would score"
    ),
    (
        "tests/test_yujianll.py::test_string_extraction",
        "$1 - \\frac{1}{\\mathrm{e}}$",
        "$1 + \\frac{1}{\\mathrm{e}}$",
        True,
    ): (
        "1 - 1/e is not 1 + 1/e: math-verify's parser stops at \\mathrm{e}, keeps '1' of both and scores "
        "them equal (a false positive its test pins); the verifier reads \\mathrm{e} as e"
    ),
    ("tests/test_strict.py::test_strict_variable_comparison", "$f(x)$", "$f(y)$", True): (
        "config: strict=False lets f(y) equal f(x); the verifier compares strictly (math-verify's default)"
    ),
    (ALL + "test_set_rel_assymetry", "$x \\in [-2,7]$", "$-2 \\\\le x \\\\le 7$", False): (
        "config: with allow_set_relation_comp=False math-verify does not compare a set-valued gold with "
        "an inequality; the verifier always does (x in [-2,7] is the condition -2 <= x <= 7), as the twin "
        "case with the flag on expects"
    ),
}


def _case_key(case: dict[str, Any]) -> tuple[str, str, str, bool]:
    return case["source"], case["gold"], case["pred"], case["expected"]


def _math_verify(gold: str, pred: str, settings: dict[str, Any] | None = None) -> bool:
    """math-verify's verdict: with ``settings`` as the upstream test gives them, else with
    its defaults (timeouts off: signal-based timeouts need the main thread)."""
    if settings is None:
        configs: list = [LatexExtractionConfig(), ExprExtractionConfig()]
        options: dict[str, Any] = {}
    else:
        priority = 0 if settings["boxed_priority_first"] else LatexExtractionConfig().boxed_match_priority
        make = {"latex": lambda: LatexExtractionConfig(boxed_match_priority=priority), "expr": ExprExtractionConfig}
        configs = [make[kind]() for kind in settings["match_types"]]
        options = {
            "float_rounding": settings["precision"],
            "strict": settings["strict"],
            "allow_set_relation_comp": settings["allow_set_relation_comp"],
        }
    gold_parsed = parse(gold, configs, parsing_timeout=None)
    return bool(verify(gold_parsed, parse(pred, configs, parsing_timeout=None), timeout_seconds=None, **options))


@pytest.fixture(scope="module")
def corpus() -> dict[str, Any]:
    return json.loads(CORPUS.read_text())


@pytest.fixture(scope="module")
def scored(corpus, math_verifier) -> list[dict[str, Any]]:
    """Each case with ``upstream`` (math-verify, case settings), ``default`` (math-verify,
    default settings), ``ours`` (the math verifier) and ``config_dependent``."""
    logging.getLogger("math_verify").setLevel(logging.CRITICAL + 1)  # timeout-off warning
    cases = corpus["cases"]
    ours = math_verifier.score_batch([case["pred"] for case in cases], [case["gold"] for case in cases])
    expected_by_pair: dict[tuple[str, str], set[bool]] = {}
    for case in cases:
        expected_by_pair.setdefault((case["gold"], case["pred"]), set()).add(case["expected"])
    rows = []
    for case, score in zip(cases, ours):
        upstream = _math_verify(case["gold"], case["pred"], case["settings"])
        default = _math_verify(case["gold"], case["pred"])
        twins = len(expected_by_pair[(case["gold"], case["pred"])]) > 1
        rows.append(
            {**case, "upstream": upstream, "default": default, "ours": score == 1.0,
             "config_dependent": upstream != default or twins}
        )
    return rows


def test_corpus_is_the_pinned_upstream_copy(corpus) -> None:
    assert corpus["commit"] == PINNED_COMMIT
    cases = corpus["cases"]
    assert len(cases) >= 250
    sources = Counter(case["source"].split("::")[0] for case in cases)
    assert len(sources) >= 6, sources  # test_all, boxed, numina, open_thoughts, strict, yujianll
    assert 0.2 < sum(case["expected"] for case in cases) / len(cases) < 0.95


def test_math_verify_passes_its_own_cases(scored) -> None:
    failing = [_case_key(row) for row in scored if row["upstream"] != row["expected"]]
    assert not failing, f"math-verify (installed) disagrees with its own tests: {failing}"


def test_disagreements_are_exactly_the_listed_ones(scored) -> None:
    disagreements = {_case_key(row): row["ours"] for row in scored if row["ours"] != row["expected"]}
    unexplained = {key: ours for key, ours in disagreements.items() if key not in DELIBERATE}
    assert not unexplained, f"new disagreements with math-verify's expected verdicts (ours shown): {unexplained}"
    assert not set(DELIBERATE) - set(disagreements), "listed disagreements that no longer occur"


def test_agreement_on_cases_that_do_not_depend_on_settings(scored) -> None:
    plain = [row for row in scored if not row["config_dependent"]]
    agreement = sum(row["ours"] == row["expected"] for row in plain) / len(plain)
    assert len(plain) >= 240
    assert agreement >= MIN_AGREEMENT, f"agreement {agreement:.3f} < {MIN_AGREEMENT}"


def test_no_false_positive_that_math_verify_does_not_make(scored) -> None:
    ours_only = [
        _case_key(row)
        for row in scored
        if row["ours"] and not row["expected"] and not row["default"] and not row["config_dependent"]
    ]
    assert not ours_only, ours_only


def test_config_dependent_disagreements_are_explained_as_settings(scored) -> None:
    for row in scored:
        reason = DELIBERATE.get(_case_key(row))
        if reason is not None:
            assert reason.startswith("config:") == row["config_dependent"], (_case_key(row), reason)
