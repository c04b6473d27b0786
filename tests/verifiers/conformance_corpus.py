r"""(gold, response) pairs on which the ``math`` verifier is compared with math-verify.

Written for this project after the formats that math-verify's own tests exercise
(huggingface/Math-Verify, tests/): numbers in running text (thousands separators,
currency, units, percent words), every math environment (``$...$``, ``$$...$$``,
``\(...\)``, ``\[...\]`` on one or several lines), malformed LaTeX (``\frac13``,
``\sqrt3``), ``\dfrac``/``\tfrac``/``\cfrac``, ``\left(...\right)``, units in ``\text``,
"k = ..." assignments and chains of equations, "final answer is ... I hope it is
correct", "answer:", boxes, sets, intervals, tuples, matrices, equations, several answers,
text answers, degrees, and responses whose correct intermediate value is followed by a
wrong final one. Right and wrong answers alike: a verifier that scores everything 0 (or
1) disagrees on about half of them.

The oracle is ``verify(parse("$" + gold + "$"), parse(response))`` with math-verify's
default configs (golds are wrapped: math-verify does not parse a bare ``\frac12``).
``DISAGREEMENTS`` lists every pair where the ``math`` verifier deliberately or knowingly
answers otherwise, with the reason; ``test_conformance.py`` checks that the list is
exact.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- values
# (gold, the same object as a model writes it in LaTeX, a wrong answer in LaTeX)
LATEX_VALUES = [
    ("3", "3", "4"),
    ("-5", "-5", "5"),
    ("0.4", "0.40", "0.04"),
    (r"\frac{1}{3}", r"\frac13", r"\frac{1}{4}"),
    ("1/3", r"\dfrac{1}{3}", r"\dfrac{3}{1}"),
    (r"\frac{10}{9}", r"\tfrac{10}{9}", r"\frac{9}{10}"),
    (r"\frac{5}{2}", r"2.5", r"\frac{2}{5}"),
    (r"2\sqrt{3}", r"\sqrt{12}", r"3\sqrt{2}"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", r"\sqrt{2}"),
    (r"\frac{1+\sqrt{5}}{2}", r"\frac{\sqrt{5}+1}{2}", r"\frac{1-\sqrt{5}}{2}"),
    (r"\pi", r"\pi", r"2\pi"),
    (r"\frac{\pi}{2}", r"\pi/2", r"\frac{\pi}{3}"),
    ("x^2+2x+1", "(x+1)^2", "(x-1)^2"),
    ("3x+2", "2+3x", "3x-2"),
    ("(1,2)", r"\left( 1, 2 \right)", "(2,1)"),
    (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", r"\left( 3, \pi \right)"),
    ("[0,1)", "[0, 1)", "(0, 1)"),
    (r"(-\infty, 3]", r"(-\infty,3]", r"(-\infty,3)"),
    (r"\{1,2,3\}", r"\{3,2,1\}", r"\{1,2\}"),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix}2\\1\end{pmatrix}"),
    ("y=2x+1", "y = 1 + 2x", "y = 2x - 1"),
    ("1000", "10^3", "10^4"),
    ("2^{10}", "1024", "1000"),
    (r"e^{2}", r"e^2", r"2e"),
]

# Ways a model writes a LaTeX answer without a box. "{}" is the answer.
LATEX_WRAPPERS = [
    "So the answer is ${}$.",
    r"Therefore the value is \( {} \).",
    "We obtain\n\\[\n{}\n\\]",
    "Putting it together: $$ {} $$",
    "Final Answer: The final answer is ${}$. I hope it is correct.",
    "**Answer:** ${}$",
    r"\boxed{{{}}}",
]

# ----------------------------------------------------------------------------- numbers
# Numbers in running text (math-verify's expression extraction): (gold, response).
PLAIN = [
    ("-5", "The result is -5"),
    ("7425000", "In total 7,425,000 people came."),
    ("1000", "It costs 1 000 dollars"),
    ("1000", "The mass is 1000.0"),
    ("1000.99", "The total is 1,000.99."),
    ("1000.99", "the price is $1,000.99"),
    ("1000.99", "the number is not 10 which is 1,000.99€"),
    ("1000.99", "not it's not 10 it's 1,000.99m²"),
    ("0.4", "It is .4"),
    ("0.111", "We get 0.111"),
    ("2", "AZYUK2A"),
    ("12", "there are 12 distinct sequences. I hope it is correct."),
    ("12", "There are 12 of them."),
    ("12", "There are 13 of them."),
    ("120", "Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct."),
    ("120", "Final Answer: The volume of $ABCDEFGH$ is 210. I hope it is correct."),
    ("12000023", "Final Answer: The final answer is 12,000,023. I hope it is correct."),
    ("2/3", "So P(A) = (1/2) / (3/4) P(A) = 2/3 Therefore, the probability is 2/3."),
    ("2/3", "So the probability is 3/2."),
    ("1/3", "k = 1/3"),
    ("1/3", "The answer is 1/3."),
    ("0.5", "answer: 1/2"),
    ("0.5", "answer: 0.5"),
    ("0.5", "answer: 0.25"),
    ("10", "The answer is (9+1)"),
    ("7", "3 + 4 = 7"),
    ("7", "3 + 4 = 8"),
    ("28\\%", "28 percent"),
    ("28\\%", "28 pct"),
    ("28\\%", "28 %"),
    ("28\\%", "$28$ percent"),
    ("28\\%", "It is 28"),
    ("0.28", "It is 28"),
    ("28", "It is 28/100"),
    ("12", "It is 12 cm."),
    ("12", "The side is 12 meters long."),
    ("12", "The side is 21 meters long."),
    ("5", "x = 5"),
    ("5", "x = 6"),
    ("-3", "The minimum value is -3."),
    ("-3", "The minimum value is 3."),
    ("4", "Answer: 4"),
    ("4", "Answer: 5"),
    ("100", "So she pays 100 dollars in the end."),
    ("1.5", "The ratio is 1.5."),
    ("1.5", "The ratio is 1.05."),
    ("36", "The area is 6 x 6 = 36 square units."),
    ("36", "The area is 6 x 6 = 63 square units."),
    ("6", "First we find 4, then adding 2 gives 6."),
    ("4", "First we find 4, then adding 2 gives 6."),
    ("40/9", "The answer is 4 4/9."),
    ("4", "The answer is 4 4/9."),
    ("4/9", "There are 4 objects and 4/9 remain."),
    ("103/9", "11 + 4/9"),
    ("95/9", "11 + 4/9"),
    ("5", "It costs $5.00"),
    ("7/25", "It is 28%"),
    # Where math-verify takes a number out of a larger expression (see DISAGREEMENTS).
    ("10", "The result is 10^{3}"),
    ("3", r"The answer is \sqrt 3"),
    ("5", "so we get 5!"),
    ("3", "The answer is x + 3"),
    ("2.74", "Soucis : 2,74 $ a.."),
]

# ----------------------------------------------------------------------------- LaTeX
# Notations of math-verify's LaTeX tests and model outputs: (gold, response).
LATEX = [
    ("9", r"Answer \[ 9 \]"),
    ("9", "Answer $ 9 $"),
    ("9", "Answer $$ 9 $$"),
    ("9", r"Answer \( 9 \)"),
    ("10", r"Answer \( (9+1) \)"),
    ("9", "Answer $ \n 9 \n $"),
    ("9", "Answer \\( \n 9 \n \\)"),
    ("9", "Answer \\[ \n 9 \n \\]"),
    ("9", "Answer $$ \n 9 \n $$"),
    ("10/9", r"Answer $ \frac{1}{2} \$ = \frac{10}{9} $"),
    ("1/3", r"$\frac13 $"),
    ("1", r"$\frac3{3} $"),
    (r"\sqrt{3}", r"$\sqrt3 $"),
    ("1/3", r"$\cfrac{1}{3} $"),
    ("1/3", r"$\dfrac{1}{3} $"),
    ("1/3", r"$\tfrac{1}{3} $"),
    ("1/3", "$ 1/3 $"),
    ("1/3", r"$\left( \frac{1}{3} \right)$"),
    ("1/3", r"$\frac{1}{3} \text{meters}$"),
    ("1/3", r"$\frac{1}{3} \textbf{meters}$"),
    ("1/3", r"$k = \frac{1}{3}$"),
    ("1/3", r"\[\left( \frac{1}{3} \right)\]"),
    ("1/2", r"\(\dfrac12\)"),
    ("1/2", r"so $x = \dfrac12$."),
    ("1/3", r"$\frac13$"),
    ("3", r"$\frac13$"),
    ("13", r"$\frac13$"),
    ("2", r"$\frac{1+\sqrt{5}}{2}$"),
    ("3", "$x^3$"),
    ("3", "$a_3$"),
    ("4", r"$\frac{34}{16}+\frac{\sqrt{1358}}{16}$"),
    (r"\sqrt{19}", "$1$"),
    ("3", r"$\log_2 8$"),
    ("2", r"$\log_2 8$"),
    ("8", r"$\log_2 8$"),
    ("9", "$x = 3^2 = 9$"),
    ("3", "$x = 3^2 = 9$"),
    ("2", "$2 = x$"),
    ("5", "$a_2 = 5$"),
    ("2", "$a_2 = 5$"),
    ("-10/9", r"$-\frac{10}{9}$"),
    ("10/9", r"$-\frac{10}{9}$"),
    ("[0,1)", "$[0,1)$"),
    ("[0,9)", "$[0,1)$"),
    ("(0,9)", "$[0,9)$"),
    ("1", "$-[0,1)$"),
    (r"(\frac{3}{5},\frac{8}{3}]", r"$(0.6,2.666667]$"),
    (r"(-\infty, -3] \cup [2, \infty)", r"The domain is $(-\infty, -3] \cup [2, \infty)$."),
    ("[-3,2]", r"The domain is $(-\infty, -3] \cup [2, \infty)$."),
    ("[-3,2]", r"the domain is the interval $[-3, 2]$."),
    (r"\text{Evelyn}", r"Therefore, $\text{Evelyn}$ is our answer."),
    (r"\text{Evelyn}", r"Therefore, $\text{Debra}$ is our answer."),
    ("90^\\circ", r"The angle is $90^\circ$."),
    ("90", r"The angle is $90^\circ$."),
    ("90^\\circ", r"The angle is $45^\circ$."),
    ("34x+45y-20z+100=0", "The plane is $-34x-45y+20z-100=0$."),
    ("34x+45y-20z+100=0", "The plane is $34x+45y-20z-100=0$."),
    (r"\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}", r"$\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}$"),
    (r"\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}", r"$\begin{pmatrix} 0 & 3 \\ 0 & 1 \end{pmatrix}$"),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"The vector is $\begin{bmatrix}1\\2\end{bmatrix}$."),
    (r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}", r"$\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}$"),
    ("x+2n+1", "$x+1$"),
    ("(a+5)(b+2)", "$(a+5)(b+2)$"),
    ("(a+5)(b+2)", "$(+5)(b+2)$"),
    ("(7,6)", "So the ordered pair $(x, y)$ that solves the system is $(7, 6)$."),
    ("(7,6)", "So the ordered pair $(x, y)$ that solves the system is $(6, 7)$."),
    ("[-1,1)", "Final Answer: The final answer is $(-1, 1)$. I hope it is correct."),
    (r"\{2,3\}", "The solutions are $x = 2$ and $x = 3$."),
    (r"\{2,3\}", "The roots are $2$ and $3$."),
    ("2", "The solutions are $x = 2$ or $x = 3$."),
    ("3", "We first get $x = 2$, and then the answer is $x = 3$."),
    ("2", "We first get $x = 2$, and then the answer is $x = 3$."),
    ("5", r"First $a = 5$. Then $b = a + 2 = 7$."),
    ("7", r"First $a = 5$. Then $b = a + 2 = 7$."),
    ("14916", r"Therefore the smallest possible value of $N$ is $14{,}916$."),
    ("14916", r"Therefore the smallest possible value of $N$ is $14{,}922$."),
    ("16386.20", r"Paula's investment is worth $\$16,\!386.20$ at the end."),
    ("0.5", r"The probability is $\frac{1}{2}$, i.e. $50\%$."),
    ("50", r"The probability is $\frac{1}{2}$, i.e. $50\%$."),
    ("i", "The answer is $i$."),
    ("-1", "$i^2$"),
    ("1+i", r"The root is $z = 1 + i$."),
    ("2", r"$\sqrt{4}$"),
    ("4", r"$\sqrt{4}$"),
    ("55", r"$\sum_{k=1}^{10} k$"),
    ("10", r"$\sum_{k=1}^{10} k$"),
    ("3", r"Since $x^2 = 9$ and $x > 0$, $x = 3$."),
    ("9", r"Since $x^2 = 9$ and $x > 0$, $x = 3$."),
    ("2", r"Hence $f(2) = 5$."),
    ("5", r"Hence $f(2) = 5$."),
    ("6", r"The number of ways is $\binom{4}{2} = 6$."),
    ("4", r"The number of ways is $\binom{4}{2} = 6$."),
    ("120", "$5! = 120$"),
    ("5", "$5! = 120$"),
    ("\\frac{3}{4}", "The final answer is: $\\frac{3}{4}$."),
    ("0.75", "The final answer is: $\\frac{3}{4}$."),
    ("x^2", r"The derivative of $\frac{x^3}{3}$ is $x^2$."),
    # boxes among other math
    ("28\\%", r"a total loss of $\boxed{28\%}$."),
    ("14/3", r"$=2+\frac{5}{3}+1=\boxed{\frac{14}{3}}$"),
    (r"\text{Evelyn}", r"Therefore, $\boxed{\text{Evelyn}}$ is our answer."),
    ("2-2p", r"If $2-x=p$, then $x=2-p$. Thus $x-p=\boxed{2-2p}$."),
    ("4", r"First \boxed{3}. Wait, that is wrong; recomputing gives \boxed{4}."),
    ("3", r"First \boxed{3}. Wait, that is wrong; recomputing gives \boxed{4}."),
    (r"\left( 3, \frac{\pi}{2} \right)", r"the polar coordinates are $\boxed{\left( 3, \frac{\pi}{2} \right)}.$"),
    ("3", r"The derivative of $\frac{x^3}{3}$ is $x^2$."),
]


def _wrapped() -> list[tuple[str, str]]:
    pairs = []
    for gold, right, wrong in LATEX_VALUES:
        for wrapper in LATEX_WRAPPERS:
            pairs.append((gold, wrapper.format(right)))
            pairs.append((gold, wrapper.format(wrong)))
    return pairs


CASES: list[tuple[str, str]] = _wrapped() + PLAIN + LATEX
"""All (gold, response) pairs."""

_FROM_EXPRESSION = (
    "policy: a number that is part of a larger expression is never the answer "
    "(math-verify takes it: a false positive)"
)
_COMMA_DECIMAL = "policy: a comma is never a decimal mark (math-verify reads 2,74 as 2.74)"

DISAGREEMENTS: dict[tuple[str, str], str] = {
    ("-1", "$i^2$"): "policy: i is the imaginary unit (math-verify reads it as a variable)",
    ("4", r"First \boxed{3}. Wait, that is wrong; recomputing gives \boxed{4}."): (
        "policy: a box separated from the last one by words is a discarded attempt (math-verify "
        "joins all boxes of the response into the set {3, 4})"
    ),
    ("10", "The result is 10^{3}"): _FROM_EXPRESSION,
    ("3", r"The answer is \sqrt 3"): _FROM_EXPRESSION,
    ("5", "so we get 5!"): _FROM_EXPRESSION,
    ("3", "The answer is x + 3"): _FROM_EXPRESSION,
    ("2.74", "Soucis : 2,74 $ a.."): _COMMA_DECIMAL,
}
"""(gold, response) -> why the ``math`` verifier's verdict differs from math-verify's."""
