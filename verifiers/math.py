"""``math``: final-answer equivalence for competition-style math, via math-verify + sympy.

Extraction: the last ``\\boxed{...}`` with brace matching and the boxes chained to it
(``extract.box_group``), found in the trainer process. A "final answer is" phrase after
the last box overrides it. Without a box (or with such a phrase), the last
``max_answer_chars`` of the response (or that many from the phrase) go to the worker,
whose fallback rules find the answer there (default ``"math_verify"``: math-verify's own
extraction, "final answer is", "answer:", the last ``$...$``/``\\(...\\)``/``\\[...\\]``
or plain number, but never a number that is part of a larger expression; see
``ggpo_verifiers.equivalence.find_answer``). Answers (or unboxed text) longer than
``max_answer_chars`` or nested deeper than ``max_answer_depth`` are unparseable before
any parser sees them. ``stats.unboxed`` counts responses without a box.

Equivalence (in a worker, see ``ggpo_verifiers.equivalence``): both sides are parsed as
LaTeX (plain numbers and expressions such as ``1/2`` or ``3x+2`` are valid LaTeX) and
compared by math-verify: symbolic simplification, sets unordered, tuples ordered,
intervals with their open/closed ends, equations and inequalities (``x > 2`` equals
``(2, \\infty)``). Policies, each pinned by a test:

* exact values (integers, fractions, integer powers) are compared exactly at every
  scale: ``2^{-40}`` equals ``\\frac{1}{1099511627776}``, not ``2^{-41}``;
* a decimal equals a non-integer value when both are within ``rel_tol`` (5e-6) and
  agree after rounding to ``float_rounding`` (6) decimal places, so ``0.333333`` equals
  ``\\frac13`` and ``0.00000015`` is not ``0.00000016``; an integer needs an exactly equal
  value (``3.0`` equals ``3``, ``3.0000001`` not);
* repeating decimals are exact: ``0.\\overline{3}`` equals ``\\frac13``;
* ``1,000`` = ``1000`` and ``10 455`` = ``10455`` (comma or
  space grouping only in a single number with 3-digit groups); ``1{,}000`` and
  ``1\\,000`` too; ``1,5`` is the list 1, 5;
* a percent sign is optional on either side: ``50\\%`` equals ``0.5`` and ``50``;
* units in ``\\text{...}``, ``\\$`` and ``^\\circ`` are dropped (``30^\\circ`` is 30, not
  ``\\pi/6``); ``x = 3`` equals ``3``; the letter ``i`` is the imaginary unit;
* a bare list ``1, 2`` equals the set ``\\{1, 2\\}``; an explicit set never equals a tuple
  or interval;
* several boxes of one answer form a list: ``\\boxed{(2, 2)} \\quad\\text{and}\\quad
  \\boxed{(6, 2)}`` equals ``(6, 2), (2, 2)``; a hedge (``\\boxed{3} or \\boxed{4}``)
  matches neither value;
* a gold may be a solution text: its final answer is used (``gold_from_solution``);
* without a box, precision before recall: a digit inside a fraction, power, root,
  subscript or factorial is never the answer (``x^3`` is not 3), and a comma is never a
  decimal mark (see "Without a box" in ``verifiers/README.md``).

Known disagreements with mathematical truth are listed in ``verifiers/README.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ggpo_verifiers.base import Verifier
from ggpo_verifiers.extract import (
    DEFAULT_REL_TOL,
    FALLBACK_RULES,
    FINAL_ANSWER_RE,
    MATH_VERIFY,
    UNBOXED,
    box_group,
    checked_fallbacks,
    has_box,
    nesting_depth,
    unboxed_text,
)
from ggpo_verifiers.registry import register_verifier

MATH_FALLBACKS = (MATH_VERIFY, *FALLBACK_RULES)
"""The fallback rules ``MathVerifier`` knows: ``"math_verify"`` and the string rules of
``ggpo_verifiers.extract`` (opt-in)."""


@register_verifier("math")
class MathVerifier(Verifier):
    """Math answer checker (1.0 if the final answer equals the gold, else 0.0).

    Args:
        fallbacks: Extraction rules tried in order, in the worker, when the response
            has no ``\\boxed{}``: ``"math_verify"`` (math-verify's extraction, minus
            numbers taken out of larger expressions), ``"answer_phrase"`` ("the answer
            is ...") and ``"last_number"`` (see ``ggpo_verifiers.extract``). ``()``
            requires a box.
        float_rounding: Decimal places to which a decimal and the value it is compared
            with must agree (math-verify's rule).
        rel_tol: Relative tolerance between a decimal and the value it is compared with
            (both must hold: ``rel_tol`` makes the comparison scale-correct, so
            0.00000015 is not 0.00000016). Exact values (integers, fractions, integer
            powers) are compared exactly at every scale; an integer needs an exactly
            equal decimal.
        max_answer_chars: Longer extracted answers are unparseable; without a box,
            the worker searches this many last characters of the response.
        max_answer_depth: Answers (and unboxed text) nested deeper than this many
            brackets are unparseable.
        tail_chars: Only the last this many characters of a response are searched.
        **kwargs: Pool settings of ``Verifier`` (timeout, workers, ...).
    """

    def __init__(
        self,
        *,
        fallbacks: Sequence[str] = (MATH_VERIFY,),
        float_rounding: int = 6,
        rel_tol: float = DEFAULT_REL_TOL,
        max_answer_chars: int = 1000,
        max_answer_depth: int = 32,
        tail_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fallbacks = checked_fallbacks(fallbacks, MATH_FALLBACKS)
        self.float_rounding = float_rounding
        if not 0 <= rel_tol < 1:
            raise ValueError(f"rel_tol={rel_tol!r} is invalid: expected 0 <= rel_tol < 1")
        self.rel_tol = rel_tol
        self.max_answer_chars = max_answer_chars
        self.max_answer_depth = max_answer_depth
        self.tail_chars = tail_chars

    def extract(self, response: str) -> str | None:
        """The content of the last box (joined with the boxes chained to it), else (with
        fallbacks) ``UNBOXED`` + response text for the worker to search: from the last
        "final answer is" phrase after the last box (it overrides the box, as in
        math-verify), else the end of the response. None if neither is usable."""
        tail = response[-self.tail_chars :]
        group = box_group(tail)
        after_box = 0 if group is None else group[1]
        phrases = list(FINAL_ANSWER_RE.finditer(tail, after_box)) if self.fallbacks else []
        if group is not None and not phrases:
            answer, prefix = group[0].strip(), ""
        elif phrases:
            start = phrases[-1].start()
            answer, prefix = tail[start : start + self.max_answer_chars].strip(), UNBOXED
        elif self.fallbacks:
            answer, prefix = unboxed_text(tail, self.max_answer_chars).strip(), UNBOXED
        else:
            return None
        if not answer or len(answer) > self.max_answer_chars or nesting_depth(answer) > self.max_answer_depth:
            return None
        return prefix + answer

    def unboxed(self, response: str, answer: str | None) -> bool:
        if answer is not None and not answer.startswith(UNBOXED):
            return False
        return not has_box(response[-self.tail_chars :])  # a box before "final answer is" counts

    def check(self, answer: str, gold: str) -> bool | None:
        """``answer`` is a box's content, or ``UNBOXED`` + response text to search."""
        from ggpo_verifiers.equivalence import equivalent

        if answer.startswith(UNBOXED):
            return equivalent(answer[len(UNBOXED) :], gold, self.float_rounding, self.fallbacks, self.rel_tol)
        return equivalent(answer, gold, self.float_rounding, rel_tol=self.rel_tol)

    def check_gold(self, gold: str) -> None:
        super().check_gold(gold)
        from ggpo_verifiers.equivalence import parse_gold

        parse_gold(gold)

    def warmup(self) -> None:
        from ggpo_verifiers.equivalence import equivalent, silence_math_verify

        silence_math_verify()
        equivalent("\\frac{1}{2}", "0.5")  # loads the LaTeX parser before the memory cap
