"""Numbers at every scale: seeded random exact values from 1e-300 to 1e300 (integers,
fractions, integer powers), each written in several forms.

* Equal values in different forms (``2^{-40}`` and ``\\frac{1}{1099511627776}``) always
  score 1; two distinct values (``2^{-40}`` and ``2^{-41}``, N and N + 1 with 300 digits,
  ``10^{-300}`` and ``2 \\cdot 10^{-300}``) never do. For ``math`` (through its workers,
  one batch) and ``numeric``.
* Decimals are compared relatively (``rel_tol``), where math-verify rounds them to 6
  decimal places, and exact values exactly, where math-verify chops tiny differences:
  ``MATH_VERIFY_SCALE_ERRORS`` lists pairs where that makes us differ from math-verify
  (the deliberate disagreements of this kind), and the test checks both verdicts.
"""

from __future__ import annotations

import logging
import math
import random
from fractions import Fraction

import pytest
from math_verify import parse, verify

from ggpo_verifiers import NumericVerifier

N_VALUES = 90
MAX_LOG10 = 300


def _integer(rng: random.Random) -> tuple[Fraction, list[str], list[str]]:
    """m * 10^k up to 1e300: its forms, and forms of its neighbours."""
    mantissa, k = rng.randrange(1, 10**15), rng.randrange(0, MAX_LOG10 - 15)
    n = mantissa * 10**k
    return Fraction(n), [str(n), rf"{mantissa} \cdot 10^{{{k}}}", rf"\frac{{{2 * n}}}{{2}}"], [
        str(n + 1),
        rf"{mantissa + 1} \cdot 10^{{{k}}}",
    ]


def _fraction(rng: random.Random) -> tuple[Fraction, list[str], list[str]]:
    """p/q with up to 150 digits each (1e-150 .. 1e150): forms and neighbours."""
    p, q = rng.randrange(1, 10 ** rng.randint(1, 150)), rng.randrange(2, 10 ** rng.randint(1, 150))
    value = Fraction(p, q)
    p, q = value.numerator, value.denominator
    forms = [rf"\frac{{{p}}}{{{q}}}", rf"\frac{{{3 * p}}}{{{3 * q}}}", f"{p}/{q}"]
    return value, forms, [rf"\frac{{{p + 1}}}{{{q}}}", rf"\frac{{{p}}}{{{q + 1}}}"]


def _power(rng: random.Random) -> tuple[Fraction, list[str], list[str]]:
    """b^e within 1e-300 .. 1e300, e negative or positive: forms and neighbours."""
    base = rng.randint(2, 12)
    e = rng.randint(1, int(MAX_LOG10 / math.log10(base))) * rng.choice((-1, 1))
    value = Fraction(base) ** e
    written = str(base ** abs(e))
    if e < 0:
        forms = [f"{base}^{{{e}}}", rf"\frac{{1}}{{{base}^{{{-e}}}}}", rf"\frac{{1}}{{{written}}}"]
        neighbours = [f"{base}^{{{e - 1}}}", rf"\frac{{1}}{{{base ** abs(e) + 1}}}"]
    else:
        forms = [f"{base}^{{{e}}}", written]
        neighbours = [f"{base}^{{{e - 1}}}" if e > 1 else "1", str(base**e + 1)]
    return value, forms, neighbours


def exact_value_cases(n: int = N_VALUES, seed: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(equal pairs, distinct pairs) of (gold, answer) texts for ``n`` seeded values."""
    rng = random.Random(seed)
    equal, distinct = [], []
    for i in range(n):
        value, forms, neighbours = (_integer, _fraction, _power)[i % 3](rng)
        assert Fraction(10) ** -MAX_LOG10 <= value <= Fraction(10) ** MAX_LOG10
        equal += [(forms[0], form) for form in forms[1:]] + [(forms[-1], forms[0])]
        distinct += [(forms[0], other) for other in neighbours] + [(other, forms[-1]) for other in neighbours]
    return equal, distinct


def test_cases_cover_every_scale_and_are_right() -> None:
    equal, distinct = exact_value_cases()
    assert len(equal) >= 2 * N_VALUES and len(distinct) >= 3 * N_VALUES
    assert any("10^{2" in gold for gold, _ in equal) and any("^{-2" in gold for gold, _ in equal)
    assert not set(equal) & set(distinct)


@pytest.fixture(scope="module")
def cases() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return exact_value_cases()


def _scores(verifier, pairs: list[tuple[str, str]]) -> list[float]:
    return verifier.score_batch([rf"\boxed{{{answer}}}" for _, answer in pairs], [gold for gold, _ in pairs])


@pytest.mark.parametrize("name", ["math", "numeric"])
@pytest.mark.parametrize(("which", "score"), [("equal", 1.0), ("distinct", 0.0)])
def test_exact_values_score_one_exactly_when_equal(name: str, which: str, score: float, cases, math_verifier) -> None:
    """Equal values in other forms always score 1; distinct values never do."""
    verifier = math_verifier if name == "math" else NumericVerifier(max_answer_chars=1000)
    pairs = cases[0] if which == "equal" else cases[1]
    wrong = [pair for pair, got in zip(pairs, _scores(verifier, pairs)) if got != score]
    assert not wrong, wrong[:5]


# (gold, answer) pairs where math-verify says equal and the verifiers do not: decimals it
# rounds to 6 decimal places, and exact values whose difference its evalf(chop=True) chops.
MATH_VERIFY_SCALE_ERRORS = [
    ("0.0000001", "0.0000002"),
    ("0.00000012", "0.00000013"),
    (r"2.5 \times 10^{-300}", r"2.6 \times 10^{-300}"),
    (r"10^{-300}", r"2\cdot 10^{-300}"),
]
# Decimals both score equal: within rel_tol, and agreeing to 6 decimal places.
DECIMAL_AGREEMENTS = [
    (r"\frac{1}{3}", "0.333333"),
    (r"1.5 \times 10^{-10}", r"1.5000001 \times 10^{-10}"),
    ("0.1", "0.100000"),
]


def test_where_math_verify_is_not_scale_correct(math_verifier) -> None:
    logging.getLogger("math_verify").setLevel(logging.CRITICAL + 1)
    pairs = MATH_VERIFY_SCALE_ERRORS + DECIMAL_AGREEMENTS
    def math_verify(text: str) -> list:
        return parse(f"${text}$", parsing_timeout=None)

    oracle = [verify(math_verify(gold), math_verify(answer), timeout_seconds=None) for gold, answer in pairs]
    assert oracle == [True] * len(pairs)
    expected = [0.0] * len(MATH_VERIFY_SCALE_ERRORS) + [1.0] * len(DECIMAL_AGREEMENTS)
    assert _scores(math_verifier, pairs) == expected
    assert _scores(NumericVerifier(), pairs) == expected
