"""The ``math`` verifier against math-verify itself, and against false positives.

* Differential conformance: on the corpus of ``conformance_corpus.py`` the verifier's
  verdict (score 1.0 or not) must agree with math-verify's
  ``verify(parse("$" + gold + "$"), parse(response))`` on at least 97% of the pairs, and
  the pairs where they differ must be exactly those listed with a reason.
* False positives: responses in which the gold's digits appear only inside other
  expressions (fractions, powers, roots, subscripts, factorials, sums) or only as an
  intermediate value before a different final answer never score 1.

Both run through the worker pool, in one batch each (the path the trainer uses).
"""

from __future__ import annotations

import logging
import random

import pytest
from conformance_corpus import CASES, DISAGREEMENTS
from math_verify import parse, verify

MIN_AGREEMENT = 0.97
N_FALSE_POSITIVE_CASES = 240


def math_verify_verdict(gold: str, response: str) -> bool:
    """math-verify's verdict with its default extraction configs (timeouts off: the
    corpus is benign, and signal-based timeouts need the main thread)."""
    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    return bool(verify(gold_parsed, parse(response, parsing_timeout=None), timeout_seconds=None))


@pytest.fixture(scope="module")
def verdicts(math_verifier) -> tuple[list[bool], list[bool]]:
    """(math-verify's verdicts, the math verifier's) on the corpus, computed once."""
    logging.getLogger("math_verify").setLevel(logging.CRITICAL + 1)  # timeout-off warning
    oracle = [math_verify_verdict(gold, response) for gold, response in CASES]
    scores = math_verifier.score_batch([r for _, r in CASES], [g for g, _ in CASES])
    return oracle, [score == 1.0 for score in scores]


def test_corpus_is_large_varied_and_without_duplicates() -> None:
    assert len(CASES) >= 300
    assert len(set(CASES)) == len(CASES), "duplicate cases"
    assert set(DISAGREEMENTS) <= set(CASES), "a listed disagreement is not in the corpus"
    unboxed = [response for _, response in CASES if "boxed" not in response]
    assert len(unboxed) >= 0.7 * len(CASES), "the corpus is about responses without a box"


def test_golds_are_usable(math_verifier) -> None:
    math_verifier.validate_golds([gold for gold, _ in CASES])


def test_both_verdicts_occur(verdicts) -> None:
    oracle, _ = verdicts
    assert 0.3 < sum(oracle) / len(oracle) < 0.7, "a constant verifier would agree on most pairs"


def test_agreement_with_math_verify(verdicts) -> None:
    oracle, ours = verdicts
    disagreements = {case for case, a, b in zip(CASES, oracle, ours) if a != b}
    agreement = 1 - len(disagreements) / len(CASES)
    unexplained = {case: ours[CASES.index(case)] for case in disagreements - set(DISAGREEMENTS)}
    assert not unexplained, f"new disagreements with math-verify (our verdict shown): {unexplained}"
    assert not set(DISAGREEMENTS) - disagreements, "listed disagreements that no longer occur"
    assert agreement >= MIN_AGREEMENT, f"agreement {agreement:.3f} < {MIN_AGREEMENT}"


# ------------------------------------------------------------------- false positives
# Templates in which the gold ``g`` (a positive integer) appears only inside another
# expression whose value is not g, or before a final answer that is not g. ``o`` is
# another integer (2..9), ``w`` a wrong final answer. Each template's value differs from
# g for every g >= 2 drawn below (fractions have a denominator >= 2 and a numerator != g*o).
FALSE_POSITIVE_TEMPLATES = [
    r"$\frac{{1+\sqrt{{5}}}}{{{g}}}$",
    r"$\frac{{{g}}}{{{o}}}$",
    r"$\frac{{{o}}}{{{g}}}$",
    r"$\frac{g}{o}$ is the answer",
    r"The answer is $\dfrac{{{g}}}{{{o}}}$.",
    r"$x^{g}$",
    r"$x^{{{g}}}$",
    r"x^{g}",
    r"The answer is $2^{{{g}}}$.",
    r"so the answer is {o}^{{{g}}}",
    r"The result is {g}^{{{o}}}",
    r"$\sqrt{{{g}}}$",
    r"The answer is \sqrt {g}",
    r"$\sqrt[{g}]{{{o}}}$",
    r"$a_{g}$",
    r"$a_{{{g}}} = {w}$",
    r"x_{g} = {w}",
    r"$\log_{{{g}}} {o}$",
    r"so we get {g}!",
    r"The answer is $x + {g}$.",
    r"The answer is x - {g}",
    r"The answer is ${g}x$.",
    r"$\binom{{{g}}}{{{o}}}$ ways",
    r"We first get $x = {g}$, but checking again, the answer is ${w}$.",
    r"We first get {g}, then doubling it gives {w}.",
    r"Since $a = {g}$, the final answer is $a + {o} = {w}$.",
    r"First $y = {g}$. Then $z = y^2 = {w}$.",
    r"The answer is {g}{o}.",
    r"The answer is $\frac{{{g}}}{{{o}}} \cdot {o}{o}$.",
]


def false_positive_cases(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` seeded (gold, response) pairs from ``FALSE_POSITIVE_TEMPLATES``, every
    template used at least once."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        template = FALSE_POSITIVE_TEMPLATES[i % len(FALSE_POSITIVE_TEMPLATES)]
        g = rng.randint(2, 99)
        o = rng.choice([v for v in range(2, 10) if v not in (g, g - 1) and g % v and v % g])
        w = g + rng.randint(1, 50)
        cases.append((str(g), template.format(g=g, o=o, w=w)))
    return cases


def test_false_positive_cases_are_distinct_and_cover_every_template() -> None:
    cases = false_positive_cases(N_FALSE_POSITIVE_CASES)
    assert len(cases) >= 200 and len(set(cases)) >= 0.95 * len(cases)
    assert all(gold in response for gold, response in cases), "the gold's digits must appear"


def test_digits_of_the_gold_inside_other_expressions_never_score_one(math_verifier) -> None:
    cases = false_positive_cases(N_FALSE_POSITIVE_CASES)
    scores = math_verifier.score_batch([r for _, r in cases], [g for g, _ in cases])
    false_positives = [case for case, score in zip(cases, scores) if score != 0.0]
    assert not false_positives


def test_the_same_templates_score_one_when_the_answer_is_right(math_verifier) -> None:
    # Guards the test above against a verifier that scores every unboxed response 0:
    # the final answers of these templates are read and can be right.
    right = [
        ("4", "We first get $x = 3$, but checking again, the answer is $4$."),
        ("8", "We first get 3, then doubling it gives 8."),
        ("9", "First $y = 3$. Then $z = y^2 = 9$."),
        ("7", "$a_{3} = 7$"),
        ("1/3", r"$\frac{1}{3}$"),
        ("x^3", "$x^3$"),
        (r"\sqrt{3}", r"$\sqrt{3}$"),
        ("8", r"The answer is $2^{3}$."),
    ]
    assert math_verifier.score_batch([r for _, r in right], [g for g, _ in right]) == [1.0] * len(right)
