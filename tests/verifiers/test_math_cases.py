"""The ``math`` verifier against a table of answers whose verdict is mathematical truth.

``TRUTH`` holds (response, gold, expected) where expected says whether the response's
final answer and the gold denote the same mathematical object; cases the checker gets
wrong are kept, marked xfail(strict=True) with the reason, and listed in
verifiers/README.md. ``POLICY`` holds cases where the verdict is a documented convention
rather than a theorem (precision, percent, degrees, hedging, list-vs-set).

All cases are scored in one batch through the worker pool (the path the trainer uses).
"""

from __future__ import annotations

import pytest

B = r"\boxed"

EQUIVALENT = [
    # fractions, decimals, notations of one number
    (rf"so {B}{{\frac{{1}}{{2}}}}", "0.5"),
    (rf"{B}{{0.5}}", r"\frac12"),
    (rf"{B}{{1/2}}", r"\frac{1}{2}"),
    (rf"{B}{{\dfrac12}}", "1/2"),
    (rf"{B}{{\tfrac{{1}}{{2}}}}", "0.5"),
    (rf"{B}{{0.50}}", r"\frac12"),
    (rf"{B}{{\frac{{2}}{{4}}}}", r"\frac12"),
    (rf"{B}{{\frac{{10}}{{4}}}}", r"\frac{5}{2}"),
    (rf"{B}{{5/2}}", "2.5"),
    (rf"{B}{{1.5}}", r"\frac{3}{2}"),
    (rf"{B}{{1.25}}", r"\frac54"),
    (rf"{B}{{\frac{{3}}{{2}}}}", r"1\frac{1}{2}"),
    (rf"{B}{{3.5}}", r"3\frac{1}{2}"),
    (rf"{B}{{\frac{{1}}{{3}}}}", r"0.\overline{3}"),
    (rf"{B}{{-\frac{{1}}{{2}}}}", "-0.5"),
    (rf"{B}{{\frac{{-1}}{{2}}}}", r"-\frac12"),
    (rf"{B}{{-\frac{{3}}{{4}}}}", r"\frac{3}{-4}"),
    (rf"{B}{{42}}", "42"),
    (rf"{B}{{-3}}", "-3"),
    (rf"{B}{{3.0}}", "3"),
    (rf"{B}{{6}}", "6.0000"),
    (rf"{B}{{-0}}", "0"),
    (rf"{B}{{1}}", r"\frac{2}{2}"),
    (rf"{B}{{2^{{-1}}}}", "0.5"),
    (rf"{B}{{0.1 + 0.2}}", "0.3"),
    (rf"{B}{{\frac{{1}}{{2}} + \frac{{1}}{{3}}}}", r"\frac56"),
    (rf"{B}{{1\times 10^3}}", "1000"),
    (rf"{B}{{3 \times 10^{{-2}}}}", "0.03"),
    (rf"{B}{{1000}}", "10^3"),
    # digit grouping
    (rf"{B}{{1,000}}", "1000"),
    (rf"{B}{{1{{,}}000}}", "1000"),
    (rf"{B}{{1\,000}}", "1000"),
    (rf"{B}{{12,345,678}}", "12345678"),
    (rf"{B}{{1000}}", "1,000"),
    # percent meaning "per hundred"
    (rf"{B}{{50\%}}", "0.5"),
    (rf"{B}{{0.5}}", r"50\%"),
    (rf"{B}{{50\%}}", r"50\%"),
    # radicals, powers, exact constants
    (rf"{B}{{\sqrt{{2}}/2}}", r"\frac{\sqrt{2}}{2}"),
    (rf"{B}{{\frac{{1}}{{\sqrt{{2}}}}}}", r"\frac{\sqrt2}{2}"),
    (rf"{B}{{\dfrac{{\sqrt{{3}}}}{{3}}}}", r"\frac{1}{\sqrt{3}}"),
    (rf"{B}{{2\sqrt{{3}}}}", r"\sqrt{12}"),
    (rf"{B}{{\sqrt{{8}}}}", r"2\sqrt{2}"),
    (rf"{B}{{\sqrt[3]{{27}}}}", "3"),
    (rf"{B}{{27^{{1/3}}}}", "3"),
    (rf"{B}{{2^{{1/2}}}}", r"\sqrt2"),
    (rf"{B}{{2}}", r"\sqrt{4}"),
    (rf"{B}{{\sqrt{{2}}+\sqrt{{3}}}}", r"\sqrt{5+2\sqrt{6}}"),
    (rf"{B}{{2^{{10}}}}", "1024"),
    (rf"{B}{{3^{{2}}}}", "9"),
    (rf"{B}{{8}}", "2^3"),
    (rf"{B}{{10!}}", "3628800"),
    (rf"{B}{{\binom{{5}}{{2}}}}", "10"),
    (rf"{B}{{\pi}}", r"\pi"),
    (rf"{B}{{2\pi}}", r"2 \pi"),
    (rf"{B}{{\frac{{\pi}}{{2}}}}", r"\pi/2"),
    (rf"{B}{{\infty}}", r"\infty"),
    # functions with exact values
    (rf"{B}{{\log_2 8}}", "3"),
    (rf"{B}{{\ln(e^2)}}", "2"),
    (rf"{B}{{\sin(\pi/6)}}", "1/2"),
    (rf"{B}{{\tan(\pi/4)}}", "1"),
    (rf"{B}{{\arctan 1}}", r"\frac{\pi}{4}"),
    (rf"{B}{{|-3|}}", "3"),
    (rf"{B}{{\lfloor 3.7 \rfloor}}", "3"),
    (rf"{B}{{\sum_{{k=1}}^{{10}} k}}", "55"),
    # complex numbers
    (rf"{B}{{1+i}}", "i+1"),
    (rf"{B}{{e^{{i\pi}}}}", "-1"),
    (rf"{B}{{i^2}}", "-1"),
    (rf"{B}{{(1+i)(1-i)}}", "2"),
    (rf"{B}{{|3+4i|}}", "5"),
    # expressions and equations
    (rf"{B}{{x^2+2x+1}}", "(x+1)^2"),
    (rf"{B}{{x^2-1}}", "(x-1)(x+1)"),
    (rf"{B}{{\frac{{1}}{{2}}x}}", "x/2"),
    (rf"{B}{{2x+3y}}", "3y+2x"),
    (rf"{B}{{a+b}}", "b+a"),
    (rf"{B}{{\frac{{a}}{{b}}}}", "a/b"),
    (rf"{B}{{\pi r^2}}", r"r^2\pi"),
    (rf"{B}{{x^{{2}}}}", "x^2"),
    (rf"{B}{{y=2x+1}}", "y = 1 + 2x"),
    # tuples, intervals, sets, matrices
    (rf"{B}{{(1,2)}}", "(1, 2)"),
    (rf"{B}{{\left(\frac{{1}}{{2}}, 3\right)}}", "(0.5, 3)"),
    (rf"{B}{{[0,1)}}", "[0, 1)"),
    (rf"{B}{{[1,2]}}", "[1, 2]"),
    (rf"{B}{{(-\infty, 2)}}", r"(-\infty,2)"),
    (rf"{B}{{\{{1,2,3\}}}}", r"\{3,2,1\}"),
    (rf"{B}{{\{{1,2,2\}}}}", r"\{1,2\}"),
    (rf"{B}{{[1,2]\cup[3,4]}}", r"[3,4] \cup [1,2]"),
    (rf"{B}{{\emptyset}}", r"\varnothing"),
    (rf"{B}{{\mathbb{{R}}}}", r"(-\infty,\infty)"),
    (rf"{B}{{(-\infty, \infty)}}", r"\mathbb{R}"),
    (rf"{B}{{x>2}}", r"(2,\infty)"),
    (rf"{B}{{(2,\infty)}}", "x>2"),
    (rf"{B}{{2 < x < 5}}", "(2,5)"),
    (rf"{B}{{x \geq 3}}", r"[3, \infty)"),
    (rf"{B}{{1 \le x \le 3}}", "[1,3]"),
    (rf"{B}{{\begin{{pmatrix}}1\\2\end{{pmatrix}}}}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
    (
        rf"{B}{{\begin{{pmatrix}} 1 & 2 \\ 3 & 4 \end{{pmatrix}}}}",
        r"\begin{bmatrix}1&2\\3&4\end{bmatrix}",
    ),
    # where the answer is in the response
    (rf"{B}{{\frac{{\sqrt{{3}}}}{{2}}}}", r"\frac{\sqrt3}{2}"),
    (rf"First {B}{{3}}. Wait, that is wrong; recomputing gives {B}{{4}}.", "4"),
    (r"$\boxed{1}$ and $\boxed{2}$", r"\{1,2\}"),
    ("So the answer is 7.", "7"),
    ("The final answer is: $\\frac{3}{4}$.", "0.75"),
    ("We get 3 + 4 = 7", "7"),
    (rf"{B}{{\text{{Monday}}}}", r"\text{Monday}"),
    (rf"{B}{{B}}", "B"),
    (rf"{B}{{30^\circ}}", r"\frac{\pi}{6}"),
    # harder cases, in the literal form of the responses
    ('\\boxed{\\frac{\\pi}{4}}', '45^\\circ'),
    ('\\boxed{\\frac{\\sqrt6-\\sqrt2}{4}}', '\\sin 15^\\circ'),
    ('\\boxed{x \\in [1,3]}', '[1,3]'),
    ('\\boxed{x=2 \\text{ or } x=3}', '\\{2,3\\}'),
    ('\\boxed{(x-2)(x+3)}', 'x^2+x-6'),
    ('\\boxed{\\frac{x+1}{x}}', '1 + \\frac1x'),
    ('\\boxed{\\sqrt{x^2}}', '|x|'),
    ('\\boxed{\\cos^2 x + \\sin^2 x}', '1'),
    ('\\boxed{e^{\\ln 2}}', '2'),
    ('\\boxed{\\log_{10} 1000}', '3'),
    ('\\boxed{\\frac{1}{4}}', '25\\%'),
    ('\\boxed{2.5\\%}', '0.025'),
    ('\\boxed{\\$1,234.50}', '1234.5'),
    ('\\boxed{1234.5}', '\\$1,234.50'),
    ('\\boxed{10^{-3}}', '0.001'),
    ('\\boxed{1.5 \\times 10^{3}}', '1500'),
    ('\\boxed{\\text{(C)}}', 'C'),
    ('\\boxed{C}', '\\text{(C)}'),
    ('\\boxed{[2, \\infty)}', 'x \\ge 2'),
    ('\\boxed{(-\\infty, 0) \\cup (0, \\infty)}', '\\mathbb{R} \\setminus \\{0\\}'),
    ('\\boxed{\\{-1, 1\\}}', '\\pm 1'),
    ('\\boxed{\\pm 2}', '\\{-2, 2\\}'),
    ('\\boxed{x = \\pm 2}', '\\{2,-2\\}'),
    ('\\boxed{\\sqrt{50}}', '5\\sqrt{2}'),
    ('\\boxed{\\sqrt{2}\\cdot\\sqrt{3}}', '\\sqrt6'),
    ('\\boxed{2\\cdot 3}', '6'),
    ('\\boxed{6.02 \\times 10^{23}}', '6.02\\times10^{23}'),
    ('\\boxed{1000000}', '10^6'),
    ('\\boxed{\\text{no solution}}', '\\text{no solution}'),
    ('\\boxed{f(x) = 2x}', '2x'),
    ('\\boxed{y = 2x + 3}', '2x + 3'),
    ('\\boxed{a = 2, b = 3}', 'a=2, b=3'),
    ('\\boxed{(a, b) = (2, 3)}', '(2,3)'),
    ('\\boxed{\\frac{9}{4}\\pi}', '\\frac{9\\pi}{4}'),
    ('\\boxed{2n+1}', '1+2n'),
    ('\\boxed{\\binom{n}{2}}', '\\frac{n(n-1)}{2}'),
    ('\\boxed{\\frac{n(n+1)}{2}}', '\\frac{n^2+n}{2}'),
    ('\\boxed{\\sqrt{-1}}', 'i'),
    ('\\boxed{\\frac{1+\\sqrt{5}}{2}}', '\\frac{\\sqrt5+1}{2}'),
    ('\\boxed{\\dfrac{3}{8}}', '0.375'),
    ('\\boxed{.5}', '\\frac12'),
    ('\\boxed{\\frac12}', '.5'),
    ('\\boxed{5 \\text{ and } 7}', '5, 7'),
    ('The answer is $\\boxed{5}$.', '5'),
    ('\\[ \\boxed{x = 2} \\]', '2'),
    ('**Final Answer**\n\n\\[\\boxed{\\dfrac{5}{12}}\\]', '\\frac{5}{12}'),
    ('\\boxed{5}\n\nLet me double-check: 2 + 3 = 5.', '5'),
    ('Answer: 5', '5'),
    ('The answer is 5. Note that 6 is wrong.', '5'),
    ('So x = 5', '5'),
    ('the total is 1,234 dollars', '1234'),
    ('\\boxed{x^3 - 8}', '(x-2)(x^2+2x+4)'),
    ('\\boxed{\\frac{2}{3}}', '0.\\overline{6}'),
    ('\\boxed{0.1\\overline{6}}', '\\frac16'),
    ('\\boxed{4}', '\\sqrt{16}'),
    ('\\boxed{4\\%}', '4'),
    ('\\boxed{\\frac{1}{3}\\%}', '\\frac{1}{300}'),
    ('\\boxed{\\left[ 1, 2 \\right]}', '[1,2]'),
    ('\\boxed{\\left\\{ 1, 2 \\right\\}}', '\\{2,1\\}'),
    ('\\boxed{\\{(1,2), (3,4)\\}}', '\\{(3,4), (1,2)\\}'),
    ('\\boxed{(1,2), (3,4)}', '(3,4), (1,2)'),
    ('\\boxed{\\frac{3}{2}}', '\\frac{3}{2}\\text{ hours}'),
    ('\\boxed{x \\le -1 \\text{ or } x \\ge 1}', '(-\\infty,-1]\\cup[1,\\infty)'),
]

NOT_EQUIVALENT = [
    (rf"{B}{{5}}", "6"),
    (rf"{B}{{-5}}", "5"),
    (rf"{B}{{-2}}", r"\sqrt{4}"),
    (rf"{B}{{100}}", "1000"),
    (rf"{B}{{999}}", "10^3"),
    (rf"{B}{{16}}", "2^3"),
    (rf"{B}{{1,000}}", "1"),
    (rf"{B}{{1,2}}", "12"),
    (rf"{B}{{25\%}}", "0.5"),
    (rf"{B}{{\frac{{1}}{{2}}}}", r"\frac{1}{3}"),
    (rf"{B}{{1/3}}", "0.3"),
    (rf"{B}{{0.333}}", r"\frac13"),
    (rf"{B}{{0.1}}", r"\frac{1}{9}"),
    (rf"{B}{{5/2}}", "2.4"),
    (rf"{B}{{\frac{{5}}{{3}}}}", "1.67"),
    (rf"{B}{{1.67}}", r"\frac53"),
    (rf"{B}{{3.14159}}", r"\pi"),
    (rf"{B}{{3.14}}", r"\pi"),
    (rf"{B}{{\frac{{22}}{{7}}}}", r"\pi"),
    (rf"{B}{{2\sqrt{{2}}}}", r"\sqrt{2}"),
    (rf"{B}{{\sqrt{{2}}}}", r"\sqrt{3}"),
    (rf"{B}{{\frac{{1}}{{0}}}}", "0"),
    (rf"{B}{{-\infty}}", r"\infty"),
    (rf"{B}{{i}}", "1"),
    (rf"{B}{{x+1}}", "x-1"),
    (rf"{B}{{x^2}}", "2x"),
    (rf"{B}{{y = x + 1}}", "y = x - 1"),
    (rf"{B}{{(2,1)}}", "(1,2)"),
    (rf"{B}{{(3,2,1)}}", "(1,2,3)"),
    (rf"{B}{{(1,2,3)}}", "(1,2)"),
    (rf"{B}{{[0,1]}}", "[0,1)"),
    (rf"{B}{{(0,1]}}", "[0,1)"),
    (rf"{B}{{\{{1,2\}}}}", r"\{1,2,3\}"),
    (rf"{B}{{\{{1,2\}}}}", "(1,2)"),
    (rf"{B}{{\begin{{pmatrix}}2\\1\end{{pmatrix}}}}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
    (rf"{B}{{\text{{Monday}}}}", r"\text{Tuesday}"),
    (rf"{B}{{A}}", "B"),
    (rf"First {B}{{3}}. Wait, that is wrong; recomputing gives {B}{{4}}.", "3"),
    (rf"{B}{{3 \text{{ or }} 4}}", "3"),
    (rf"{B}{{}}", "0"),
    ("I don't know.", "5"),
    # harder cases, in the literal form of the responses
    ('\\boxed{\\frac{\\sqrt{2}}{2}}', '0.7071'),
    ('\\boxed{2}', '\\pm 2'),
    ('\\boxed{6.02 \\times 10^{23}}', '6.03\\times10^{23}'),
    ('\\boxed{0.000001}', '0'),
    ('\\boxed{123456789}', '123456788'),
    ('\\boxed{12345678.9}', '12345679'),
    ('\\boxed{\\frac{1+\\sqrt{5}}{2}}', '\\frac{1-\\sqrt{5}}{2}'),
    ('\\boxed{\\{(1,2), (3,4)\\}}', '\\{(1,2), (4,3)\\}'),
    ('\\boxed{-1}', '1'),
    ('\\boxed{1/2}', '2'),
    ('\\boxed{0}', '\\emptyset'),
]

# Cases above that the checker gets wrong; keep this list in sync with README.md.
_DEGREES = "degree signs are dropped, so the degrees are read as radians"
KNOWN_WRONG: dict[tuple[str, str], str] = {
    (rf"{B}{{30^\circ}}", r"\frac{\pi}{6}"): _DEGREES,
    ("\\boxed{\\frac{\\pi}{4}}", "45^\\circ"): _DEGREES,
    ("\\boxed{\\frac{\\sqrt6-\\sqrt2}{4}}", "\\sin 15^\\circ"): _DEGREES,
    ("\\boxed{\\frac{1}{3}\\%}", "\\frac{1}{300}"): "a percent sign after a fraction is ignored (it is parsed on numbers only)",
    ("\\boxed{x \\le -1 \\text{ or } x \\ge 1}", "(-\\infty,-1]\\cup[1,\\infty)"): "inequalities joined by 'or' are not read as a union",
}

POLICY = [
    # (response, gold, expected, the policy that decides it)
    (rf"{B}{{0.333333}}", r"\frac13", 1, "decimals agreeing to 6 places equal the gold"),
    (rf"{B}{{0.3333333333}}", r"\frac{1}{3}", 1, "decimals agreeing to 6 places equal the gold"),
    (rf"{B}{{0.33333}}", r"\frac13", 0, "decimals agreeing to 6 places equal the gold"),
    (rf"{B}{{50}}", r"50\%", 1, "a percent sign is optional"),
    (rf"{B}{{50\%}}", "50", 1, "a percent sign is optional"),
    (rf"{B}{{90^\circ}}", "90", 1, "degree signs are dropped"),
    (rf"{B}{{1.0000004}}", "1.000000", 1, "decimals agreeing to 6 places equal the gold"),
    (rf"{B}{{1.0000001}}", "1", 0, "an integer gold needs an exactly equal value"),
    (rf"{B}{{0.0000001}}", "0", 0, "an integer gold needs an exactly equal value"),
    (rf"{B}{{3.000}}", "3", 1, "an integer gold needs an exactly equal value"),
    (rf"{B}{{\$12}}", "12", 1, "currency signs are dropped"),
    (rf"{B}{{12 \text{{ cm}}}}", "12", 1, "units in \\text{} are dropped"),
    (rf"{B}{{x=3}}", "3", 1, "an assignment equals its value"),
    (rf"{B}{{3}}", "x=3", 1, "an assignment equals its value"),
    (rf"{B}{{1,5}}", "1.5", 0, "a comma is never a decimal mark"),
    (rf"{B}{{1, 2}}", r"\{1,2\}", 1, "a bare list equals the set of its elements"),
    (rf"{B}{{0}}", r"\{0\}", 1, "a bare list equals the set of its elements"),
    (rf"{B}{{3}} or {B}{{4}}", "4", 0, "adjacent boxes are one (hedged) answer"),
    (rf"{B}{{3}}, {B}{{4}}", "3, 4", 1, "adjacent boxes are one answer"),
    # Without a box (the "math_verify" fallback; verifiers/README.md, "Without a box")
    ("The answer is 12, I think", "12", 1, "no box: the number after 'answer is'"),
    ("no box here, just 12 at the end", "12", 1, "no box: the last number"),
    ("It is 12 cm.", "12", 1, "no box: units after a number are ignored"),
    ("k = 1/3", "1/3", 1, "no box: the last plain expression"),
    (r"$\frac13$", "1/3", 1, "no box: the last math environment"),
    (r"$k = \frac{1}{3}$", "1/3", 1, "no box: an assignment equals its value"),
    (r"\(\dfrac12\)", "0.5", 1, "no box: the last math environment"),
    (r"\[\left( \frac{1}{3} \right)\]", "1/3", 1, "no box: the last math environment"),
    (r"The matrix is $\begin{pmatrix}1\\2\end{pmatrix}$.", r"\begin{pmatrix}1\\2\end{pmatrix}", 1, "no box: the last math environment"),
    (r"The set is $\{1, 2\}$.", r"\{1,2\}", 1, "no box: the last math environment"),
    ("The domain is $[0, 1)$.", "[0,1)", 1, "no box: the last math environment"),
    ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "0.75", 1, "no box: 'final answer is' first"),
    ("We first get $x = 2$; the answer is $x = 3$.", "2", 0, "no box: an intermediate value is not the answer"),
    (r"$\frac{1+\sqrt{5}}{2}$", "2", 0, "no box: never a number from inside an expression"),
    ("x^3", "3", 0, "no box: never a number from inside an expression"),
    (r"$\frac13$", "3", 0, "no box: never a number from inside an expression"),
    ("The result is 10^{3}", "10", 0, "no box: never a number from inside an expression"),
    (r"The answer is \sqrt 3", "3", 0, "no box: never a number from inside an expression"),
    ("so we get 5!", "5", 0, "no box: never a number from inside an expression"),
    ("The answer is x + 3", "3", 0, "no box: never a number from inside an expression"),
    ("The value is 2,74", "2.74", 0, "a comma is never a decimal mark"),
]

TRUTH = [(r, g, 1) for r, g in EQUIVALENT] + [(r, g, 0) for r, g in NOT_EQUIVALENT]


def _case(response: str, gold: str, expected: int) -> object:
    reason = KNOWN_WRONG.get((response, gold))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(response, gold, expected, marks=marks, id=f"{gold[:20]}<-{response[-30:]}")


@pytest.fixture(scope="module")
def scores(math_verifier) -> dict[tuple[str, str], float]:
    pairs = [(r, g) for r, g, _ in TRUTH] + [(r, g) for r, g, *_ in POLICY]
    values = math_verifier.score_batch([r for r, _ in pairs], [g for _, g in pairs])
    return dict(zip(pairs, values))


def test_table_is_large_and_balanced() -> None:
    assert len(TRUTH) >= 80
    assert len(EQUIVALENT) >= 40 and len(NOT_EQUIVALENT) >= 40
    assert len(set((r, g) for r, g, _ in TRUTH)) == len(TRUTH), "duplicate cases"


@pytest.mark.parametrize(("response", "gold", "expected"), [_case(*c) for c in TRUTH])
def test_mathematical_truth(scores, response: str, gold: str, expected: int) -> None:
    assert scores[(response, gold)] == expected


@pytest.mark.parametrize(("response", "gold", "expected", "policy"), POLICY, ids=[f"{p[3][:30]}:{p[1]}" for p in POLICY])
def test_documented_policy(scores, response: str, gold: str, expected: int, policy: str) -> None:
    assert scores[(response, gold)] == expected, policy


def test_string_fallbacks_are_opt_in_and_run_in_the_worker() -> None:
    from ggpo_verifiers import MathVerifier

    responses = [r"$\frac13$", "3 + 4 = 7", "The answer is 12x + 3."]
    golds = ["1/3", "7", "12x+3"]
    with MathVerifier(fallbacks=("last_number",), workers=1) as last_number:
        # "\frac13" has no number outside LaTeX; the last number of "12x + 3." is 3
        assert last_number.score_batch(responses, golds) == [0.0, 1.0, 0.0]
    with MathVerifier(fallbacks=("answer_phrase", "last_number"), workers=1) as both:
        assert both.score_batch(responses, golds) == [0.0, 1.0, 1.0]
