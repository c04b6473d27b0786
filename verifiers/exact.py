"""``exact`` (normalized string match) and ``numeric`` (number within a tolerance).

Both checks are bounded-time pure-Python string work on answers capped at
``max_answer_chars`` (regexes without backtracking blow-ups, ``float()`` on short
strings), so they run in the caller's process (``isolated = False``): a worker pool
would add a process round trip and protect against nothing. Neither evaluates text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, NamedTuple

from ggpo_verifiers.base import GoldAnswerError, Verifier
from ggpo_verifiers.extract import (
    DEFAULT_REL_TOL,
    FALLBACKS,
    checked_fallbacks,
    exact_power,
    final_answer,
    gold_from_solution,
    has_box,
    normalize_latex_answer,
)
from ggpo_verifiers.registry import register_verifier

_TEXT_COMMAND_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_QUOTES = "\"'`*"


def normalize_text(text: str, case_sensitive: bool = False) -> str:
    """Text normalized for ``exact``: Unicode NFKC, math delimiters and ``\\text{}``-like
    wrappers removed, quotes/markdown emphasis and a trailing full stop stripped,
    whitespace collapsed, case folded unless ``case_sensitive``."""
    text = normalize_latex_answer(unicodedata.normalize("NFKC", text))
    text = _TEXT_COMMAND_RE.sub(r"\1", text)
    text = " ".join(text.split()).strip(_QUOTES).strip().rstrip(".").strip()
    return text if case_sensitive else text.casefold()


def _no_box_in_tail(verifier: ExactVerifier | NumericVerifier, response: str, answer: str | None) -> bool:
    """``Verifier.unboxed`` of ``exact`` and ``numeric``: no balanced box in the part of
    the response they search."""
    return not has_box(response[-verifier.tail_chars :])


@register_verifier("exact")
class ExactVerifier(Verifier):
    """1.0 if the normalized answer equals the normalized gold (see ``normalize_text``);
    a gold solution text gives its final answer (``gold_from_solution``).

    The answer is the last ``\\boxed{}``, else the first fallback that matches, else the
    whole response (if it is at most ``max_answer_chars`` long).

    Args:
        case_sensitive: Compare case (default: case-insensitive).
        fallbacks: Extraction rules tried when there is no box (``"answer_phrase"``,
            ``"last_number"``).
        max_answer_chars: Longer answers are unparseable.
        tail_chars: Only the last this many characters of a response are searched.
        **kwargs: Settings of ``Verifier`` (cache_size, ...).
    """

    isolated = False

    def __init__(
        self,
        *,
        case_sensitive: bool = False,
        fallbacks: Sequence[str] = ("answer_phrase",),
        max_answer_chars: int = 1000,
        tail_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.case_sensitive = case_sensitive
        self.fallbacks = checked_fallbacks(fallbacks)
        self.max_answer_chars = max_answer_chars
        self.tail_chars = tail_chars

    def extract(self, response: str) -> str | None:
        answer = final_answer(response, self.fallbacks, self.tail_chars, self.max_answer_chars)
        if answer is None and len(response) <= self.max_answer_chars:
            answer = response.strip() or None
        return answer

    unboxed = _no_box_in_tail

    def check(self, answer: str, gold: str) -> bool:
        expected = normalize_text(gold_from_solution(gold), self.case_sensitive)
        return normalize_text(answer, self.case_sensitive) == expected

    def check_gold(self, gold: str) -> None:
        if not normalize_text(gold_from_solution(gold)):
            raise GoldAnswerError(gold, "it is empty after normalization")


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_PLAIN_RE = re.compile(rf"({_NUMBER})(?:[eE]([-+]?\d+))?")
_SCIENTIFIC_RE = re.compile(rf"({_NUMBER})\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?([-+]?\d+)\}}?")
_POWER_RE = re.compile(r"([-+]?)(\d+)\s*\^\s*(?:\{\s*([-+]?\d+)\s*\}|(\d))")
# One level of braces inside an argument: \frac{1}{2^{40}}. The alternatives start with
# different characters, so matching is linear.
_FRACTION_RE = re.compile(r"([-+]?)\s*\\[dt]?frac\s*\{((?:[^{}]|\{[^{}]*\})*)\}\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_UNIT_RE = re.compile(r"\\(?:text|mathrm|mbox)\s*\{[^{}]*\}|\\\$|\\[,!;: ]")
# Decimal exponents beyond this are not numbers a checker should meet (1e999 overflows a
# float); it also bounds the size of the exact value of "1e-300".
MAX_DECIMAL_EXPONENT = 400


class Number(NamedTuple):
    """A number read from text: its exact ``value``, and whether that value is ``exact``
    (written as an integer, a fraction or an integer power) or a decimal (``3.5``,
    ``2e-3``, ``1.5 \\times 10^{3}``), i.e. possibly rounded."""

    value: Fraction
    exact: bool


def parse_number(text: str) -> Number | None:
    """The number written in ``text``: ``-12``, ``3.5``, ``1,000``, ``2e-3``,
    ``2 \\times 10^{-3}``, ``2^{-40}``, ``3/4``, ``\\frac{3}{4}``, ``\\frac{1}{2^{40}}`` or
    ``50\\%`` (= 1/2), with units in ``\\text{}`` and ``\\$`` ignored; None for anything
    else. Exact rational arithmetic on regex matches of a capped answer: never evaluates
    text, never computes a value beyond ``MAX_EXACT_BITS``."""
    text = _UNIT_RE.sub("", normalize_latex_answer(text)).strip()
    scale = Fraction(1)
    if text.endswith("%"):
        text, scale = text.rstrip("%").rstrip("\\").strip(), Fraction(1, 100)
    number = _fraction(text) or _atom(text)
    return None if number is None else Number(number.value * scale, number.exact)


def _fraction(text: str) -> Number | None:
    """``\\frac{a}{b}`` or ``a/b`` of two atoms (``_atom``), else None."""
    if match := _FRACTION_RE.fullmatch(text):
        sign, numerator, denominator = match[1], _atom(match[2].strip()), _atom(match[3].strip())
    elif text.count("/") == 1:
        sign, (numerator, denominator) = "", (_atom(part.strip()) for part in text.split("/"))
    else:
        return None
    if numerator is None or denominator is None or denominator.value == 0:
        return None
    value = numerator.value / denominator.value
    return Number(-value if sign == "-" else value, numerator.exact and denominator.exact)


def _atom(text: str) -> Number | None:
    """An integer, a decimal (``3.5``, ``2e-3``, ``1.5 \\times 10^{3}``) or an integer
    power (``2^{-40}``, ``10^3``), else None."""
    if match := _POWER_RE.fullmatch(text):
        value = exact_power(Fraction(int(match[2])), int(match[3] or match[4]))
        return None if value is None else Number(-value if match[1] == "-" else value, True)
    match = _PLAIN_RE.fullmatch(text) or _SCIENTIFIC_RE.fullmatch(text)
    if match is None or abs(int(match[2] or 0)) > MAX_DECIMAL_EXPONENT:
        return None
    mantissa = match[1].lstrip("+")
    value = Fraction(mantissa if mantissa[-1:] != "." else mantissa[:-1]) * Fraction(10) ** int(match[2] or 0)
    written_exact = "." not in mantissa and not (match.re is _PLAIN_RE and match[2])  # not 2e-3
    return Number(value, written_exact)


@register_verifier("numeric")
class NumericVerifier(Verifier):
    """1.0 if the answer is the gold number.

    Numbers are read by ``parse_number``; the answer is found like ``math``'s (last box,
    then fallbacks); a gold solution text gives its final answer (``gold_from_solution``).
    Two exact numbers (integers, fractions, integer powers) must be equal, exactly, at
    any scale (2^{-40} is not 2^{-41}). When either is a decimal:
    ``|answer - gold| <= max(rel_tol * max(|answer|, |gold|), abs_tol)``, computed exactly.

    Args:
        rel_tol: Relative tolerance when a decimal is involved.
        abs_tol: Absolute tolerance when a decimal is involved (default 0: an absolute
            tolerance makes all small numbers equal; set it only for golds near 0).
        fallbacks: Extraction rules tried when there is no box.
        max_answer_chars: Longer answers are unparseable.
        tail_chars: Only the last this many characters of a response are searched.
        **kwargs: Settings of ``Verifier`` (cache_size, ...).
    """

    isolated = False

    def __init__(
        self,
        *,
        rel_tol: float = DEFAULT_REL_TOL,
        abs_tol: float = 0.0,
        fallbacks: Sequence[str] = FALLBACKS,
        max_answer_chars: int = 200,
        tail_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if rel_tol < 0 or abs_tol < 0:
            raise ValueError(f"rel_tol={rel_tol!r} and abs_tol={abs_tol!r} must be >= 0")
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol
        self.fallbacks = checked_fallbacks(fallbacks)
        self.max_answer_chars = max_answer_chars
        self.tail_chars = tail_chars

    def extract(self, response: str) -> str | None:
        return final_answer(response, self.fallbacks, self.tail_chars, self.max_answer_chars)

    unboxed = _no_box_in_tail

    def check(self, answer: str, gold: str) -> bool | None:
        expected = _gold_number(gold)
        number = parse_number(answer)
        if number is None:
            return None
        if number.exact and expected.exact:
            return number.value == expected.value
        tolerance = max(Fraction(self.rel_tol) * max(abs(number.value), abs(expected.value)), Fraction(self.abs_tol))
        return abs(number.value - expected.value) <= tolerance

    def check_gold(self, gold: str) -> None:
        _gold_number(gold)


@lru_cache(maxsize=4096)
def _gold_number(gold: str) -> Number:
    """The number of a gold (or of a gold solution's final answer); GoldAnswerError if
    there is none. Cached: the golds of a dataset repeat across an RL group."""
    number = parse_number(gold_from_solution(gold))
    if number is None:
        raise GoldAnswerError(gold, "it is not a finite number (see ggpo_verifiers.exact.parse_number)")
    return number
