"""Mathematical equivalence of two answer strings, decided with math-verify and sympy.

Runs only inside verifier worker processes (it imports sympy, and parsing untrusted
LaTeX can hang or exhaust memory: the pool's hard timeout and memory cap contain that).
Only math-verify's LaTeX extraction is used: its plain-expression extraction hands text
to ``sympy.parse_expr``, which evaluates Python code. Parsed objects never leave this
module as text: ``str()`` of a sympy object can run ``evalf`` and hang.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from math_verify import LatexExtractionConfig, parse, verify
from sympy import Basic, I, MatrixBase

from ggpo_verifiers.base import GoldAnswerError
from ggpo_verifiers.extract import container_kind, normalize_latex_answer

_LATEX_ONLY = [LatexExtractionConfig()]


def silence_math_verify() -> None:
    """Mute math-verify's loggers: on a timeout they log the whole (untrusted, maybe
    megabyte-long) input, and with its own timeouts off they warn on every process."""
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def parse_latex(text: str) -> list:
    """math-verify's parse of ``text`` as one inline-math LaTeX expression.

    Returns ``[sympy_object, normalized_string]``, ``[normalized_string]`` when only
    extraction worked, or ``[]``. Timeouts are the worker pool's job (math-verify's
    signal-based ones fail outside the main thread and on float values).
    """
    parsed = parse(f"${text}$", extraction_config=_LATEX_ONLY, parsing_timeout=None)
    return [_imaginary_unit(item) for item in parsed]


def _imaginary_unit(item: object) -> object:
    """Read the symbol ``i`` as the imaginary unit (the LaTeX parser makes it a variable,
    so ``i^2`` would not equal ``-1``)."""
    if not isinstance(item, Basic):
        return item
    return item.xreplace({s: I for s in item.free_symbols if getattr(s, "name", None) == "i"})


def has_math(parsed: list) -> bool:
    """Whether a ``parse_latex`` result holds a sympy object (not just a string)."""
    return bool(parsed) and isinstance(parsed[0], (Basic, MatrixBase))


@lru_cache(maxsize=4096)
def _normalized(gold: str) -> str:
    return normalize_latex_answer(gold)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    return parse_latex(_normalized(gold))


def parse_gold(gold: str) -> list:
    """Parse a gold answer (trusted dataset text, so its parse is cached); raise
    ``GoldAnswerError`` if it is not a mathematical object."""
    parsed = _parse_gold(gold)
    if not has_math(parsed):
        raise GoldAnswerError(
            gold,
            "it does not parse as a math answer (LaTeX, number or expression); fix the "
            "row, or use the 'exact' verifier for free-text answers",
        )
    return parsed


def equivalent(answer: str, gold: str, float_rounding: int = 6) -> bool | None:
    """Whether ``answer`` denotes the same mathematical object as ``gold``.

    None means the answer could not be parsed at all. Raises ``GoldAnswerError`` when
    the gold does not parse to a mathematical object. Policies beyond math-verify's
    own: number formats as in ``normalize_latex_answer``, ``i`` is the imaginary unit,
    and a set never equals a tuple or interval.
    """
    gold_parsed = parse_gold(gold)
    answer = normalize_latex_answer(answer)
    if answer == _normalized(gold):
        return True  # the same text denotes the same object: skip parsing (common in RL)
    answer_parsed = parse_latex(answer)
    if not answer_parsed:
        return None
    kinds = {container_kind(answer), container_kind(_normalized(gold))}
    if kinds == {"set", "sequence"}:
        return False
    return verify(
        gold_parsed,
        answer_parsed,
        float_rounding=float_rounding,
        allow_set_relation_comp=True,
        timeout_seconds=None,
    )
