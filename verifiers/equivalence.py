"""Mathematical equivalence of two answer strings, decided with math-verify and sympy.

Runs only inside verifier worker processes (it imports sympy, and parsing untrusted
text can hang or exhaust memory: the pool's hard timeout and memory cap contain that,
and math-verify's own signal-based timeouts are off). Parsed objects never leave this
module as text: ``str()`` of a sympy object can run ``evalf`` and hang.

Answers in a box are parsed as LaTeX only. Responses without a box go through
``find_answer``: math-verify's LaTeX and plain-expression extraction (same regexes, same
priorities) with two added rules for precision. math-verify's plain-expression
extraction hands a matched expression to ``sympy.parse_expr``, which is ``eval``; its
regex admits only digits, ``.``, spaces, ``+-*/^()`` and ``×÷``, so no Python name can
be formed, and ``_usable_expression`` checks before each call that the expression holds
nothing but digits, ``.``, spaces and ``+-*/^()``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from fractions import Fraction
from functools import lru_cache, partial
from itertools import groupby

from math_verify import ExprExtractionConfig, LatexExtractionConfig, grader, parse, verify
from math_verify.parser import extract_match, get_extraction_regexes
from sympy import Add, Basic, Float, I, Integer, MatrixBase, Mul, Pow, Rational, S, UnevaluatedExpr

from ggpo_verifiers.extract import (
    DEFAULT_REL_TOL,
    FALLBACK_RULES,
    MATH_VERIFY,
    bounded,
    container_kind,
    gold_from_solution,
    normalize_latex_answer,
    exact_power,
    part_of_expression,
    plain_numbers,
    reads_as_prose,
)
from ggpo_verifiers.records import GoldAnswerError

_LATEX_ONLY = [LatexExtractionConfig()]
# math-verify's extraction patterns as (priority, pattern, config), by priority. Boxes
# are the parent's job: a response reaching find_answer has no balanced box.
_UNBOXED_PATTERNS = sorted(
    (
        (priority, pattern, config)
        for regexes, config in get_extraction_regexes(
            [LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()]
        )
        for pattern, priority in regexes
    ),
    key=lambda item: item[0],
)
_SAFE_EXPRESSION_RE = re.compile(r"[\d.\s+\-*/^()]*")
_NUMBER_GROUP_RE = re.compile(r"expr|integer\d|decimal\d")


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
    """The gold's answer (``gold_from_solution``: a solution text gives its final answer),
    normalized; raises ``GoldAnswerError``."""
    return normalize_latex_answer(gold_from_solution(gold))


@lru_cache(maxsize=4096)
def parse_gold(gold: str) -> list:
    """Parse a gold answer, or the final answer of a gold solution text (trusted dataset
    text, so its parse is cached; an unusable gold raises each time); raise
    ``GoldAnswerError`` if it is not a mathematical object, or if it is prose without a
    marked final answer (the LaTeX parser would read it as a product of letters)."""
    marked = _normalized(gold) != normalize_latex_answer(gold.strip())
    unmarked_hint = "; a solution text must mark its answer with \\boxed{}, '####' or 'final answer is'"
    if not marked and reads_as_prose(gold):  # the LaTeX parser reads prose as a product of letters
        raise GoldAnswerError(gold, "it reads as prose, not a math answer" + unmarked_hint)
    parsed = parse_latex(_normalized(gold))
    if not has_math(parsed):
        raise GoldAnswerError(
            gold,
            ("its final answer" if marked else "it")
            + " does not parse as a math answer (LaTeX, number or expression)"
            + ("" if marked else unmarked_hint)
            + "; fix the row, or use the 'exact' verifier for free-text answers",
        )
    return parsed


def find_answer(text: str, rules: Sequence[str] = (MATH_VERIFY,)) -> tuple[list, str] | None:
    """The final answer of response ``text`` (which has no box), parsed: the result of
    the first rule that yields a mathematical object, as ``(parsed, answer_text)``;
    None if no rule does.

    Rules: ``"math_verify"`` (``math_verify_answer``) and the string rules of
    ``ggpo_verifiers.extract`` (``"answer_phrase"``, ``"last_number"``), whose answer
    is then parsed as LaTeX.
    """
    for rule in rules:
        if rule == MATH_VERIFY:
            found = math_verify_answer(text)
        else:
            answer = FALLBACK_RULES[rule](text)
            answer = normalize_latex_answer(answer) if answer else ""
            parsed = parse_latex(answer) if answer else []
            found = (parsed, answer) if has_math(parsed) else None
        if found is not None:
            return found
    return None


def math_verify_answer(text: str) -> tuple[list, str] | None:
    """math-verify's extraction (its ``parse`` with the LaTeX and expression configs,
    boxes left out), stricter on two points: a plain number that is part of a larger
    expression is skipped (the ``10`` of ``10^{3}``, the ``3`` of ``\\sqrt 3`` or
    ``x + 3``, the ``5`` of ``5!``; see ``extract.part_of_expression``), where
    math-verify takes it; and a comma is never a decimal mark (``2,74`` is skipped).

    Candidates are tried by math-verify's priorities ("final answer is" first, then
    "answer:", then any ``$...$``, ``\\(...\\)``, ``\\[...\\]``, fraction or number), the
    right-most first within a priority; the first that parses wins (digit grouping and
    ``\\mathrm{e}`` read as in ``normalize_latex_answer``: ``extract.plain_numbers``). An error while
    parsing a candidate means no answer (math-verify's ``parse`` returns ``[]`` then).
    """
    text = plain_numbers(text)
    for _, group in groupby(_UNBOXED_PATTERNS, key=lambda item: item[0]):
        matches = [(match, config) for _, pattern, config in group for match in pattern.finditer(text)]
        matches.sort(key=lambda item: (item[0].end(), -item[0].start()), reverse=True)
        for match, config in matches:
            if isinstance(config, ExprExtractionConfig) and not _usable_expression(text, match):
                continue
            try:
                parsed, answer = extract_match(match, config)
            except Exception:  # as math-verify's parse: an error means no answer
                return None
            if parsed is not None:
                return [_imaginary_unit(parsed), answer], answer
    return None


def _usable_expression(text: str, match: re.Match[str]) -> bool:
    """Whether a plain-expression match stands on its own and is safe to parse: not part
    of a larger expression (``part_of_expression``), no comma as decimal mark (``1,5`` is not
    1.5, as in a box) and nothing but digits and operators for ``sympy.parse_expr``
    (no Python names: see the module docstring)."""
    groups = match.groupdict()
    spans = [match.span(name) for name, value in groups.items() if value and _NUMBER_GROUP_RE.fullmatch(name)]
    if not spans or part_of_expression(text, min(start for start, _ in spans), max(end for _, end in spans)):
        return False
    if any(value and value.startswith(",") for name, value in groups.items() if name.startswith("decimal")):
        return False
    return _SAFE_EXPRESSION_RE.fullmatch(groups.get("expr") or "") is not None


def equivalent(
    answer: str,
    gold: str,
    float_rounding: int = 6,
    rules: Sequence[str] | None = None,
    rel_tol: float = DEFAULT_REL_TOL,
) -> bool | None:
    """Whether ``answer`` denotes the same mathematical object as ``gold``.

    ``answer`` is a box's content, or, when ``rules`` is given, response text without a
    box whose answer ``find_answer(answer, rules)`` extracts. None means no answer
    could be parsed. Raises ``GoldAnswerError`` when the gold does not parse to a
    mathematical object. Policies beyond math-verify's own: number formats as in
    ``normalize_latex_answer``, ``i`` is the imaginary unit, a set never equals a tuple
    or interval, and numbers compare scale-correctly (``numbers_equal``: exact values
    exactly, decimals within ``rel_tol``; ``float_rounding`` is math-verify's rule where
    that one does not decide).
    """
    gold_parsed = parse_gold(gold)
    if rules is not None:
        found = find_answer(answer, rules)
        if found is None:
            return None
        answer_parsed, answer = found
    else:
        answer = normalize_latex_answer(answer)
        if answer == _normalized(gold):
            return True  # the same text denotes the same object: skip parsing (common in RL)
        answer_parsed = parse_latex(answer)
        if not answer_parsed:
            return None
    kinds = {container_kind(answer), container_kind(_normalized(gold))}
    if kinds == {"set", "sequence"}:
        return False
    with _scale_correct_numbers(rel_tol):
        return verify(
            gold_parsed,
            answer_parsed,
            float_rounding=float_rounding,
            allow_set_relation_comp=True,
            timeout_seconds=None,
        )


@contextmanager
def _scale_correct_numbers(rel_tol: float) -> Iterator[None]:
    """Make math-verify compare numbers with ``numbers_equal`` while the block runs.

    math-verify's number comparison (``grader.sympy_numeric_eq``, which it calls for
    every number it meets, inside tuples, intervals and matrices too) is not scale-correct:
    it rounds decimals to 6 places (0.00000015 equals 0.00000016) and compares unevaluated
    expressions with ``evalf(chop=True)``, which chops tiny differences (10^{-300} equals
    2*10^{-300}). Swapped in only around our own ``verify`` call, so math-verify used
    directly elsewhere in the process is untouched; checks run one at a time per process.
    """
    original = grader.sympy_numeric_eq
    grader.sympy_numeric_eq = partial(numbers_equal, fallback=original, rel_tol=rel_tol)
    try:
        yield
    finally:
        grader.sympy_numeric_eq = original


def numbers_equal(
    a: Basic, b: Basic, float_rounding: int, numeric_precision: int, *, fallback: Callable[..., bool], rel_tol: float
) -> bool:
    """Scale-correct number comparison, in place of math-verify's ``sympy_numeric_eq``:

    * both sides exact (``exact_value``: integers, fractions, sums, products and integer
      powers of them): exact rational equality, at any scale;
    * both sides numbers, at least one written with a decimal, neither an exact integer:
      ``|a - b| <= rel_tol * max(|a|, |b|)`` (evaluated to 30 digits: scale-correct,
      0.00000015 is not 0.00000016) and, as math-verify asks, equal once rounded to
      ``float_rounding`` decimal places (100000000.5 is not 100000000.4);
    * anything else (symbols, percentages, an integer against a decimal, which needs the
      exact value): math-verify's own comparison (``fallback``).
    """
    x, y = exact_value(a), exact_value(b)
    if x is not None and y is not None:
        return x == y
    integer = (x is not None and x.denominator == 1) or (y is not None and y.denominator == 1)
    if not integer and _decimal_number(a, b):
        va, vb = a.evalf(30), b.evalf(30)
        close = abs(va - vb) <= rel_tol * max(abs(va), abs(vb))
        if close in (S.true, S.false):  # a complex or unevaluated value gives a relation
            return bool(close) and va.round(float_rounding) == vb.round(float_rounding)
    return fallback(a, b, float_rounding, numeric_precision)


def _decimal_number(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are both plain numbers (no symbols, no percent) and at least
    one of them holds a decimal (``Float``)."""
    numbers = all(
        isinstance(e, Basic) and not isinstance(e, MatrixBase) and e.is_number and not e.has(UnevaluatedExpr)
        for e in (a, b)
    )
    return numbers and (a.has(Float) or b.has(Float))


def exact_value(expr: object) -> Fraction | None:
    """The exact rational value of a sympy expression built from integers and fractions
    with ``+``, ``*`` and integer powers (``2^{-40}``, ``\\frac{1}{2^{40}}``, ``3 \\cdot
    10^{300}``), or None for anything else (decimals, roots, symbols) or when a value would
    exceed ``MAX_EXACT_BITS``. Python integer arithmetic on bounded sizes: no evaluation
    of text."""
    if isinstance(expr, Rational):  # Integer too
        return bounded(Fraction(int(expr.p), int(expr.q)))
    if isinstance(expr, (Add, Mul)):
        values = [exact_value(arg) for arg in expr.args]
        if any(value is None for value in values):
            return None
        return bounded(sum(values, Fraction(0)) if isinstance(expr, Add) else math.prod(values, start=Fraction(1)))
    if isinstance(expr, Pow) and isinstance(expr.exp, Integer):
        base = exact_value(expr.base)
        return None if base is None else exact_power(base, int(expr.exp))
    return None
