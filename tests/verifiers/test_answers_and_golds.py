"""Several boxes in one response, golds given as solution texts, thousands separators:
the ``math`` verifier through its workers, and the pure-string extraction under it."""

from __future__ import annotations

import time

import pytest

from ggpo_verifiers import GoldAnswerError, MathVerifier, NumericVerifier, gold_from_solution
from ggpo_verifiers.extract import box_group, last_boxed, normalize_latex_answer

B = r"\boxed"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (rf"$$ {B}{{(2, 2)}} \quad\text{{and}}\quad {B}{{(6, 2)}} $$", "(2, 2), (6, 2)"),
        (rf"{B}{{k = 45}} \quad \text{{and}} \quad {B}{{n = 2}}", "k = 45, n = 2"),
        (rf"{B}{{(3, 3)}} \text{{ for part (a) and }} {B}{{(1, 1)}}", "(3, 3), (1, 1)"),
        (rf"\( y_1 = {B}{{a}} \) and \( y_2 = {B}{{b}} \)", "a, b"),
        (rf"{B}{{5}} if $n$ is even, {B}{{6}} otherwise", "5, 6"),  # a hedge: one answer
        (rf"{B}{{7}}, {B}{{7}}", "7"),  # the same value twice is one value
        (rf"{B}{{1}} no no no no no {B}{{2}}", "2"),  # words without a separator: a new attempt
        (rf"{B}{{3}}. Wait, that is wrong; so {B}{{4}}", "4"),  # a sentence ends between them
        (rf"{B}{{1}} and " + "x" * 70 + rf" {B}{{2}}", "2"),  # too far apart
        (rf"{B}{{1}} ++ {B}{{2}}", "1, 2"),  # no word between them
    ],
)
def test_boxes_of_one_answer_are_combined(text: str, expected: str) -> None:
    assert last_boxed(text) == expected


def test_box_group_is_linear_time() -> None:
    text = rf"{B}{{1}}, " * 200_000  # 2 MB of chained boxes
    start = time.perf_counter()
    answer, end = box_group(text)
    assert answer == "1" and end == len(text) - 2
    assert time.perf_counter() - start < 2.0


MATH_SOLUTION = (
    r"Setting $x = y = 0,$ we get $2f(0) = f(0) - 1,$ so $f(0) = -1.$ ... This factors as "
    r"$(n - 1)(n + 2) = 0,$ so the solutions are $n = \boxed{1,-2}.$"
)
GSM8K_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
MINERVA_SOLUTION = (
    r"It retains $90 \% \cdot 80 \%=72 \%$ of its value. Final Answer: The final answer is $28 \%$. "
    "I hope it is correct."
)


@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        ("72", "72"),
        (r"  \frac{1}{2} ", r"\frac{1}{2}"),
        (MATH_SOLUTION, "1,-2"),
        (GSM8K_SOLUTION, "72"),
        ("#### 1,000\n", "1,000"),
        (MINERVA_SOLUTION, r"28 \%"),
        (rf"So {B}{{200}}. Then... The final answer is $10,455$.", "10,455"),  # phrase after the box
        (rf"The final answer is ${B}{{5}}$.", "5"),
        (rf"{B}{{2}}, {B}{{3}}, {B}{{5}}", "2, 3, 5"),
        (rf"{B}{{1}} no no no no no {B}{{2}}", "2"),
        (r"It is \fbox{7}.", "7"),
        (rf"So the answer is {B} 5.", "5"),  # the brace-less box; the full stop ends the sentence
        (rf"so {B}42$", "42"),
        (rf"{B}{{3}} then {B} 4", "4"),  # brace-less after a braced box: the last wins
        (rf"{B} 4 then {B}{{3}}", "3"),
        (rf"nested {B}{{\sqrt{{\frac{{a}}{{b}}}}}} done", r"\sqrt{\frac{a}{b}}"),  # brace matching
        (rf"{B}{{\{{1, 2\}}}}", r"\{1, 2\}"),  # escaped braces are text, not grouping
        (rf"first {B}{{1}}. Finally {B}{{\frac{{1}}{{2}}}}", r"\frac{1}{2}"),  # several boxes: the last
        (rf"{B}{{2}} and {B}{{3}}", "2, 3"),  # several boxes of one answer: chained
        ("it is 3", "it is 3"),  # no marker: a bare answer field, taken as it is
    ],
)
def test_gold_from_solution(gold: str, expected: str) -> None:
    assert gold_from_solution(gold) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [(MATH_SOLUTION, "1,-2"), (GSM8K_SOLUTION, "72"), (MINERVA_SOLUTION, r"28 \%"), (rf"so {B} 5.", "5")],
)
def test_a_solution_gives_the_answer_it_marks(text: str, expected: str) -> None:
    assert gold_from_solution(text, solution=True) == expected


@pytest.mark.parametrize("text", ["We add them and get 3.", "72", "The answer is 3 apples.", ""])
def test_a_solution_marking_no_answer_gives_no_gold(text: str) -> None:
    """A worked solution (MATH's ``solution``, GSM8K's ``answer``) without a marker states no gold: refused, so
    the row is reported and left out rather than trained on with its whole text as the gold (scored 0)."""
    with pytest.raises(GoldAnswerError, match="marks no final answer"):
        gold_from_solution(text, solution=True)


@pytest.mark.parametrize(
    ("gold", "reason"),
    [
        ("", "it is empty"),
        (rf"so {B}{{}}.", r"final answer \(\\boxed\{\}\) is empty"),
        ("reasoning...\n#### ", "final answer \\('####'\\) is empty"),
        (rf"{B}{{1}} and then {B}{{W(n) = 1", r"last \\boxed\{ is never closed"),
    ],
)
def test_gold_from_solution_reports_unusable_golds(gold: str, reason: str) -> None:
    with pytest.raises(GoldAnswerError, match=reason):
        gold_from_solution(gold)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("10,455", "10455"),
        ("10 455", "10455"),
        ("1 000 000", "1000000"),
        (r"10\,455", "10455"),
        ("3,5", "3,5"),  # a list, not 35
        ("1 2", "1 2"),
        ("1,000 000", "1,000 000"),  # mixed separators: not one grouped number
        ("(1, 000)", "(1, 000)"),
    ],
)
def test_thousands_separators(text: str, normalized: str) -> None:
    assert normalize_latex_answer(text) == normalized


# (response, gold, expected score): through the worker pool, in one batch.
SCORED = [
    (rf"$$ {B}{{(2, 2)}} \quad\text{{and}}\quad {B}{{(6, 2)}} $$", "(2, 2), (6, 2)", 1.0),
    (rf"$$ {B}{{(2, 2)}} \quad\text{{and}}\quad {B}{{(6, 2)}} $$", "(6, 2), (2, 2)", 1.0),  # a set: unordered
    (rf"$$ {B}{{(2, 2)}} \quad\text{{and}}\quad {B}{{(6, 2)}} $$", "(2, 2)", 0.0),
    (rf"{B}{{(2, 6)}} and {B}{{(2, 2)}}", "(2, 2), (6, 2)", 0.0),  # tuples stay ordered
    (rf"{B}{{k = 45}} \quad \text{{and}} \quad {B}{{n = 2}}", "k = 45, n = 2", 1.0),
    (rf"{B}{{5}} if $n$ is even, {B}{{6}} otherwise", "5", 0.0),
    (rf"{B}{{5}} if $n$ is even, {B}{{6}} otherwise", "6", 0.0),
    *((", ".join(rf"{B}{{{k}}}" for k in range(1, 10)), str(gold), 0.0) for gold in (1, 5, 9)),
    (rf"So {B}{{200}}, then {B}{{255}}. The final answer is $10,455$. I hope it is correct.", "10455", 1.0),
    (rf"So {B}{{200}}, then {B}{{255}}. The final answer is $10,455$. I hope it is correct.", "255", 0.0),
    (rf"{B}{{5}}. The final answer is correct.", "5", 1.0),  # no answer after the phrase
    (rf"{B}{{10 455}}", "10455", 1.0),
    (r"The answer is $10\,455$.", "10,455", 1.0),
    (rf"{B}{{3,5}}", "35", 0.0),
    (rf"{B}{{-2}} \quad \text{{and}} \quad {B}{{1}}", MATH_SOLUTION, 1.0),
    (rf"{B}{{1}}", MATH_SOLUTION, 0.0),
    (rf"{B}{{72}}", GSM8K_SOLUTION, 1.0),
    (rf"{B}{{28\%}}", MINERVA_SOLUTION, 1.0),
]


def test_multi_answer_solution_golds_and_separators(math_verifier) -> None:
    scores = math_verifier.score_batch([r for r, _, _ in SCORED], [g for _, g, _ in SCORED])
    wrong = [(case, score) for case, score in zip(SCORED, scores) if score != case[2]]
    assert not wrong, wrong


def test_validate_golds_accepts_solutions_and_names_broken_rows(math_verifier) -> None:
    math_verifier.validate_golds([MATH_SOLUTION, GSM8K_SOLUTION, MINERVA_SOLUTION, "5"])
    with pytest.raises(GoldAnswerError, match="never closed") as caught:
        math_verifier.validate_golds(["5", rf"so {B}{{x = 3"])
    assert caught.value.index == 1
    prose = "We count the cases one by one and add them up, which gives the total we wanted."
    with pytest.raises(GoldAnswerError, match="must mark its answer"):
        math_verifier.validate_gold(prose)


def test_numeric_reads_solution_golds() -> None:
    verifier = NumericVerifier()
    verifier.validate_golds([GSM8K_SOLUTION])
    assert verifier.score_batch([r"\boxed{72}", r"\boxed{24}"], [GSM8K_SOLUTION] * 2) == [1.0, 0.0]


def test_math_verifier_rejects_a_bad_rel_tol() -> None:
    with pytest.raises(ValueError, match="rel_tol"):
        MathVerifier(rel_tol=-1.0)
