"""The ``exact`` and ``numeric`` verifiers (checked in-process: bounded string work)."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from ggpo_verifiers import ExactVerifier, GoldAnswerError, NumericVerifier, Status
from ggpo_verifiers.exact import normalize_text, parse_number


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("Paris", "paris", 1),
        ("  Paris.  ", "Paris", 1),
        ("**Paris**", "Paris", 1),
        (r"so \boxed{\text{Paris}}", "Paris", 1),
        ("The answer is Paris.", "paris", 1),
        ("$x+1$", "x+1", 1),
        ("１２", "12", 1),  # NFKC: full-width digits
        ("Pariss", "Paris", 0),
        ("x + 1", "x+1", 0),  # exact means exact: spacing inside an answer matters
        (r"\boxed{Lyon} (not Paris)", "Paris", 0),
        ("", "Paris", 0),
    ],
)
def test_exact(response: str, gold: str, expected: int) -> None:
    assert ExactVerifier().score(response, gold) == expected


def test_exact_case_sensitive() -> None:
    assert ExactVerifier(case_sensitive=True).score("paris", "Paris") == 0.0
    assert normalize_text(r"\textbf{Yes}", case_sensitive=True) == "Yes"


@pytest.mark.parametrize("gold", ["", "   ", "$$", "**"])
def test_exact_rejects_empty_golds(gold: str) -> None:
    with pytest.raises(GoldAnswerError, match="empty"):
        ExactVerifier().validate_gold(gold)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42.0),
        ("-3.5", -3.5),
        ("+.5", 0.5),
        ("1,000", 1000.0),
        ("1{,}000.5", 1000.5),
        ("2e-3", 0.002),
        (r"2 \times 10^{-3}", 0.002),
        ("3/4", 0.75),
        (r"\frac{3}{4}", 0.75),
        (r"-\dfrac{3}{4}", -0.75),
        (r"50\%", 0.5),
        ("50%", 0.5),
        (r"\$12", 12.0),
        (r"12 \text{ cm}", 12.0),
        (r"0.\overline{3}", 1 / 3),
        ("$7$.", 7.0),
        ("1e999", None),  # overflows to infinity
        ("1/0", None),
        ("nan", None),
        ("inf", None),
        ("x", None),
        ("1 2", None),
        ("__import__('os').system('true')", None),
    ],
)
def test_parse_number(text: str, value: float | None) -> None:
    number = parse_number(text)
    assert (number and float(number.value)) == (pytest.approx(value) if value is not None else None)


@pytest.mark.parametrize(
    ("text", "value", "exact"),
    [
        ("2^{-40}", Fraction(1, 2**40), True),
        (r"\frac{1}{2^{40}}", Fraction(1, 2**40), True),
        ("1/1099511627776", Fraction(1, 2**40), True),
        (r"3 \times 10^{-300}", Fraction(3, 10**300), True),
        (r"-\frac{7}{10^{3}}", Fraction(-7, 1000), True),
        ("1.5e-300", Fraction(15, 10**301), False),  # decimals may be rounded values
        (r"1.5 \times 10^{300}", Fraction(15 * 10**299), False),
        ("0.1", Fraction(1, 10), False),
        (r"\frac{0.5}{2}", Fraction(1, 4), False),
    ],
)
def test_parse_number_is_exact_at_every_scale(text: str, value: Fraction, exact: bool) -> None:
    assert parse_number(text) == (value, exact)


@pytest.mark.parametrize("text", ["9^{999999999}", "2^{-100000}", "1e999", r"\frac{1}{7^{99999}}"])
def test_parse_number_never_computes_huge_values(text: str) -> None:
    start = time.perf_counter()
    assert parse_number(text) is None
    assert time.perf_counter() - start < 0.1


def test_numeric_tolerance() -> None:
    strict, loose = NumericVerifier(), NumericVerifier(rel_tol=1e-2)
    assert strict.score(r"\boxed{3.1415927}", "3.14159265") == 1.0
    assert strict.score(r"\boxed{3.14}", "3.14159265") == 0.0
    assert loose.score(r"\boxed{3.14}", "3.14159265") == 1.0
    assert strict.score(r"\boxed{1e-12}", "0") == 0.0  # no absolute tolerance by default
    assert NumericVerifier(abs_tol=1e-9).score(r"\boxed{1e-12}", "0") == 1.0  # opt-in, for golds near zero
    assert strict.score("The answer is 1,000 apples.", "1000") == 1.0


def test_numeric_gold_must_be_a_number() -> None:
    verifier = NumericVerifier()
    with pytest.raises(GoldAnswerError, match="not a finite number"):
        verifier.validate_gold(r"\sqrt{2}")
    outcome = verifier.evaluate_batch([r"\boxed{1}"], [r"\sqrt{2}"])[0]
    assert outcome == (0.0, Status.BAD_GOLD)
    assert verifier.stats.bad_gold == 1


def test_exact_and_numeric_run_in_process_and_fast_on_huge_input() -> None:
    huge = "9" * 1_000_000
    start = time.perf_counter()
    for verifier in (ExactVerifier(), NumericVerifier()):
        assert verifier.score_batch([huge, rf"\boxed{{{huge}}}"], ["9", "9"]) == [0.0, 0.0]
        assert verifier._pool is None  # no worker processes were started
    assert time.perf_counter() - start < 2.0
