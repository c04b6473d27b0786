"""``exact`` (normalized string match) and ``numeric`` (number within a tolerance).

Both checks are bounded-time pure-Python string work on answers capped at
``max_answer_chars`` (regexes without backtracking blow-ups, ``float()`` on short
strings), so they run in the caller's process (``isolated = False``): a worker pool
would add a process round trip and protect against nothing. Neither evaluates text.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from ggpo_verifiers.base import GoldAnswerError, Verifier
from ggpo_verifiers.extract import FALLBACKS, checked_fallbacks, final_answer, has_box, normalize_latex_answer
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
    """1.0 if the normalized answer equals the normalized gold (see ``normalize_text``).

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
        return normalize_text(answer, self.case_sensitive) == normalize_text(gold, self.case_sensitive)

    def check_gold(self, gold: str) -> None:
        if not normalize_text(gold):
            raise GoldAnswerError(gold, "it is empty after normalization")


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_PLAIN_RE = re.compile(rf"({_NUMBER})(?:[eE]([-+]?\d+))?")
_SCIENTIFIC_RE = re.compile(rf"({_NUMBER})\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?([-+]?\d+)\}}?")
_FRACTION_RE = re.compile(rf"([-+]?)\s*\\[dt]?frac\s*\{{({_NUMBER})\}}\s*\{{({_NUMBER})\}}|({_NUMBER})\s*/\s*({_NUMBER})")
_UNIT_RE = re.compile(r"\\(?:text|mathrm|mbox)\s*\{[^{}]*\}|\\\$|\\[,!;: ]")


def parse_number(text: str) -> float | None:
    """A finite float from a number written as ``-12``, ``3.5``, ``1,000``, ``2e-3``,
    ``2 \\times 10^{-3}``, ``3/4``, ``\\frac{3}{4}`` or ``50\\%`` (= 0.5), with units in
    ``\\text{}`` and ``\\$`` ignored; None for anything else. Never evaluates text."""
    text = _UNIT_RE.sub("", normalize_latex_answer(text)).strip()
    scale = 1.0
    if text.endswith("%"):
        text, scale = text.rstrip("%").rstrip("\\").strip(), 0.01
    value: float | None = None
    if match := _PLAIN_RE.fullmatch(text):
        value = float(f"{match[1]}e{match[2] or 0}")
    elif match := _SCIENTIFIC_RE.fullmatch(text):
        value = float(f"{match[1]}e{match[2]}")
    elif match := _FRACTION_RE.fullmatch(text):
        sign, numerator, denominator = (match[1], match[2], match[3]) if match[2] else ("", match[4], match[5])
        value = float(numerator) / float(denominator) if float(denominator) else None
        value = -value if value is not None and sign == "-" else value
    if value is None or not math.isfinite(value * scale):
        return None
    return value * scale


@register_verifier("numeric")
class NumericVerifier(Verifier):
    """1.0 if the answer is a number within tolerance of the gold number.

    Numbers are read by ``parse_number``; the answer is found like ``math``'s (last box,
    then fallbacks). Equality is ``math.isclose(answer, gold, rel_tol, abs_tol)``.

    Args:
        rel_tol: Relative tolerance.
        abs_tol: Absolute tolerance (matters for golds near 0).
        fallbacks: Extraction rules tried when there is no box.
        max_answer_chars: Longer answers are unparseable.
        tail_chars: Only the last this many characters of a response are searched.
        **kwargs: Settings of ``Verifier`` (cache_size, ...).
    """

    isolated = False

    def __init__(
        self,
        *,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
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
        gold_value = self._gold_value(gold)
        value = parse_number(answer)
        if value is None:
            return None
        return math.isclose(value, gold_value, rel_tol=self.rel_tol, abs_tol=self.abs_tol)

    def check_gold(self, gold: str) -> None:
        self._gold_value(gold)

    def _gold_value(self, gold: str) -> float:
        value = parse_number(gold)
        if value is None:
            raise GoldAnswerError(gold, "it is not a finite number (see ggpo_verifiers.exact.parse_number)")
        return value

