"""Parent-side answer extraction and normalization: pure string functions."""

from __future__ import annotations

import random
import re
import time

import pytest

from ggpo_verifiers.extract import (
    answer_phrase,
    boxed_answers,
    checked_fallbacks,
    container_kind,
    final_answer,
    has_box,
    inside_latex,
    last_boxed,
    last_number,
    nesting_depth,
    normalize_latex_answer,
    part_of_expression,
    unboxed_text,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are content, not grouping
        (r"\boxed{\left\{ 1 \right\}}", r"\left\{ 1 \right\}"),
        (r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
        (r"\boxed {7}", "7"),
        (r"\fbox{7}", "7"),
        (r"\boxed{3} then \boxed{4}", "4"),  # the last box wins
        (r"\boxed{3} or \boxed{4}", "3, 4"),  # a hedge is one answer
        (r"$\boxed{1}$, $\boxed{2}$ and $\boxed{3}$", "1, 2, 3"),
        (r"\boxed{\boxed{5}}", r"\boxed{5}"),  # the outer box; its content is normalized later
        (r"\boxed{1} ... \boxed{2", "1"),  # an unbalanced box is skipped
        (r"\boxed{}", ""),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_boxed_answers_reports_positions() -> None:
    text = r"a \boxed{1} b \boxed{x^{2}}"
    assert [content for _, _, content in boxed_answers(text)] == ["1", "x^{2}"]
    start, end, _ = boxed_answers(text)[1]
    assert text[start:end] == r"\boxed{x^{2}}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So the answer is 7.", "7"),
        ("The final answer is: $\\frac{3}{4}$. Done", "\\frac{3}{4}"),
        ("The final answer is \\(x=2\\) here", "x=2"),
        ("**Answer:** 12 apples", "12"),
        ("The answer is 12, I think", "12"),
        ("The answer is 12x + 3.", "12x + 3"),
        ("answer: 1 + x", "1 + x"),  # not "1"
        ("The answer is 50% of it", "50%"),
        ("answer = -1,000.", "-1,000"),
        ("The answer is x = 5. Done", "x = 5"),
        ("answer is 5. Note that the answer is 6.", "6"),  # the last phrase wins
        ("no phrase here", None),
    ],
)
def test_answer_phrase(text: str, expected: str | None) -> None:
    assert answer_phrase(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 + 4 = 7", "7"),
        ("costs 1,000 dollars", "1,000"),
        ("-2.5 or 3/4", "3/4"),
        ("The result is -5", "-5"),
        ("x = -3", "-3"),
        ("none", None),
        # never a number out of a larger expression (the false positives of issue #16)
        (r"$\frac{1+\sqrt{5}}{2}$", None),
        ("x^3", None),
        (r"$\frac13$", None),
        (r"$k = \frac{1}{3}$", None),
        (r"\sqrt[3]{27}", None),
        ("10^{3}", None),
        ("5!", None),
        ("a_3 = 7", "7"),  # the 3 is a subscript, the 7 stands alone
        ("We get 4, then 2^{10}", "4"),
        # operators do not count here (numeric's arithmetic reads as before)
        ("17+25", "25"),
        ("3-7", "-7"),
    ],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


def _old_last_number(text: str) -> str | None:
    """``last_number`` before issue #16, the reference for text without LaTeX."""
    matches = re.findall(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+", text)
    return matches[-1] if matches else None


def test_last_number_is_unchanged_on_the_arithmetic_tasks_alphabet() -> None:
    # What the tiny model can write (ggpo_lightning.tasks.tiny_model.SYMBOLS and WORDS): no LaTeX,
    # so the numeric verifier of the quickstart reads every sampled response as before.
    from ggpo_lightning.tasks.tiny_model import SYMBOLS, WORDS

    rng = random.Random(0)
    tokens = list(SYMBOLS) + [f" {word} " for word in WORDS]
    texts = ["".join(rng.choices(tokens, k=rng.randint(1, 12))) for _ in range(3000)]
    assert sum(_old_last_number(t) is not None for t in texts) > 2000
    assert [last_number(t) for t in texts] == [_old_last_number(t) for t in texts]


@pytest.mark.parametrize(
    ("text", "number", "expected"),
    [
        ("x^3", "3", True),
        ("a_{12}", "12", True),
        ("\\frac13", "13", True),
        ("\\sqrt 3", "3", True),
        ("\\sqrt[3]{8}", "3", True),
        ("10^{3}", "10", True),
        ("5! ways", "5", True),
        ("x + 3", "3", True),
        ("x -3", "-3", True),
        ("7 - y", "7", True),
        ("2 * 3", "3", True),
        ("answer: 1 + x", "1", True),
        ("is -5", "-5", False),  # a word before a minus sign is no operand
        ("x = 3.", "3", False),
        ("12 apples", "12", False),
        ("(3, 4)", "3", False),
    ],
)
def test_part_of_expression(text: str, number: str, expected: bool) -> None:
    start = text.index(number)
    assert part_of_expression(text, start, start + len(number)) is expected
    latex_only = expected and not any(op in text for op in "+-*")
    assert inside_latex(text, start, start + len(number)) is latex_only


def test_unboxed_text_keeps_the_end_and_starts_at_a_line() -> None:
    assert unboxed_text("short", 10) == "short"
    text = "first line $a$\nsecond $b$\nthird $c$"
    assert unboxed_text(text, 20) == "third $c$"  # the cut falls in "second": start after it
    assert unboxed_text("word " * 10, 12) == "word word "  # no line break: start at a space
    assert len(unboxed_text("x" * 50, 12)) == 12


def test_has_box() -> None:
    assert has_box(r"so \boxed{1}") and has_box(r"\fbox{x}")
    assert not has_box(r"\boxed{1") and not has_box("no box") and not has_box(r"\boxed")


def test_final_answer_prefers_box_then_fallbacks_in_order() -> None:
    text = r"The answer is 5 but \boxed{6}; 7"
    assert final_answer(text) == "6"
    assert final_answer("The answer is 5; 7") == "5"
    assert final_answer("The answer is 5; 7", fallbacks=("last_number",)) == "7"
    assert final_answer("The answer is 5; 7", fallbacks=()) is None


def test_final_answer_caps_length_and_depth() -> None:
    assert final_answer(r"\boxed{" + "1" * 1001 + "}") is None
    assert final_answer(r"\boxed{" + "1" * 1000 + "}") == "1" * 1000
    deep = "(" * 33 + "1" + ")" * 33
    assert final_answer(rf"\boxed{{{deep}}}") is None
    assert final_answer(rf"\boxed{{{deep[1:-1]}}}") == deep[1:-1]


def test_final_answer_reads_only_the_tail() -> None:
    assert final_answer(r"\boxed{1}" + " " * 5000) is None  # the box is outside the tail
    assert final_answer(r"\boxed{1}" + " " * 5000, tail_chars=6000) == "1"


def test_extraction_is_fast_on_hostile_text() -> None:
    floods = [
        r"\boxed{" * 100_000,  # many unbalanced boxes: linear, not quadratic
        "{" * 10_000 + "1" + "}" * 10_000,
        "x" * 1_000_000,
        "\\[" * 500_000,
    ]
    start = time.perf_counter()
    for text in floods:
        final_answer(text, tail_chars=len(text))
    assert time.perf_counter() - start < 5.0


def test_unknown_fallback_is_rejected() -> None:
    with pytest.raises(ValueError, match="last_sentence"):
        checked_fallbacks(["last_sentence"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,000", "1000"),
        ("-12,345.5", "-12345.5"),
        ("1{,}000", "1000"),
        ("1\\,000", "1000"),
        ("1,5", "1,5"),  # not a thousands grouping: a list
        ("1,00", "1,00"),
        ("(1,000, 2)", "(1,000, 2)"),  # only a lone number is ungrouped
        ("$\\frac12$", "\\frac12"),
        ("\\(x\\)", "x"),
        ("3.", "3"),
        ("a\nb", "a b"),
        ("0.\\overline{3}", "\\frac{3}{9}"),
        ("1.1\\overline{6}", "\\frac{105}{90}"),  # 7/6
        ("\\varnothing", "\\emptyset"),
    ],
)
def test_normalize_latex_answer(text: str, expected: str) -> None:
    assert normalize_latex_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\{1,2\\}", "set"),
        ("\\left\\{1\\right\\}", "set"),
        ("\\lbrace 1 \\rbrace", "set"),
        ("(1,2)", "sequence"),
        ("[0,1)", "sequence"),
        ("(1,2)\\cup(3,4)", None),
        ("(x+1)(x-1)", None),
        ("5", None),
    ],
)
def test_container_kind(text: str, expected: str | None) -> None:
    assert container_kind(text) == expected


def test_nesting_depth() -> None:
    assert nesting_depth("{[()]}") == 3
    assert nesting_depth("a(b)c(d)") == 1
    assert nesting_depth(")))") == 0
