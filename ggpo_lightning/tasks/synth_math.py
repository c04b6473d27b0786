r"""Synthetic math problems in several families and difficulty levels, with LaTeX gold answers.

A row is ``{"id", "problem", "answer", "family", "level"}``: ``problem`` is plain text
with LaTeX math inside ``$...$`` (``"Compute $\frac{1}{2} + \frac{1}{3}$."``) and
``answer`` is the exact result as ``sympy.latex`` writes it: an integer (``"-4"``) or a
reduced fraction (``"\frac{5}{6}"``, ``"- \frac{1}{6}"``), so the ``math`` verifier can
check it. Families (:data:`FAMILIES`) at levels 1..3 (:data:`LEVELS`, harder with the
level):

* ``arithmetic``: multi-digit ``+`` and ``-``, with one ``\times`` from level 2; more and
  longer operands with the level.
* ``fractions``: sums, differences and products of two or three fractions.
* ``linear``: solve ``a x + b = c`` (level 3: ``a x + b = c x + d``) for ``x``.
* ``polynomial``: evaluate a quadratic or cubic at an integer (level 3: a fraction).
* ``gcd``: greatest common divisor of two numbers (level 3: of three).
* ``columns``: ``a + b`` or ``a - b`` (``a >= b``) of two 2-, 3- or 4-digit numbers (levels 1, 2, 3), worked column
  by column: each step is one digit's sum or difference with its carry or borrow, so the length of the solution, not
  any one step, carries the computation. :func:`forgotten_carry` works such a problem with a classic slip (each
  carry or borrow written down, then forgotten in the next column): a wrong teacher for a warm-up.

With ``SynthMathConfig(solutions=True)`` (``ggpo data synth --solutions``) a row also carries ``solution``, a worked
solution: a few short steps of text and LaTeX, one a line, ending in ``The final answer is $\boxed{answer}$.``
(the box the ``math`` verifier reads)::

    Over $6$: $\frac{3}{6} + \frac{2}{6} = \frac{5}{6}$.
    The final answer is $\boxed{\frac{5}{6}}$.

The steps follow the computation (products first, then sums left to right through the common denominator;
moving terms and dividing; powers, terms and their sum; Euclid's division and remainders; one digit column at a
time, units first, the answer read back from the written digits) and are computed from the
drawn numbers without drawing more, so the problems are the same with or without them. Under the reasoning
tokenizer (:func:`~ggpo_lightning.tasks.tiny_model.build_reasoning_tokenizer`; prompts through the paper's template,
:data:`~ggpo_lightning.records.prompts.PAPER_TEMPLATE`) a solution plus ``<eos>`` is 40 to 150 tokens in every cell
but ``fractions``, ``polynomial`` and ``columns`` level 3 (about 110 to 210: the long end of a length sweep).

``SynthMathTask`` (families and levels only) is the reasoning recipe's task (``recipes/reasoning-cpu.yaml``,
``synthetic_data.task``): it writes the splits with worked solutions, and its ``problems`` stream is what the recipe's
tiny model warms up on.

Problems are built from Python ints and sympy objects, never by parsing strings, so
generation cannot execute text. It is deterministic: every (family, level) cell draws
from its own ``random.Random`` seeded by the config seed, family and level. This module
does not import torch.

Typical use::

    config = SynthMathConfig(families=("fractions", "linear"), levels=(1, 2, 3), n_train=2000, n_test=500)
    train_file, test_file = write_synth_splits(config, "runs/synth")
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Any, Callable, Iterator

import sympy

from ggpo_lightning.tasks.arithmetic import write_recorded_splits

__all__ = ["FAMILIES", "LEVELS", "SynthMathConfig", "SynthMathTask", "forgotten_carry", "generate_synth_splits",
           "worked_solution", "write_synth_splits"]

LEVELS = (1, 2, 3)
# Bump when the rows generated for given parameters change: splits recorded with another
# version are then reported as stale instead of silently reused.
_GENERATOR_VERSION = 2  # 2: the columns family (the default families' splits are shared over more cells)
# A cell gives up after this many draws in a row that repeat a prompt already taken:
# its problem space is (nearly) exhausted for the requested number of rows.
_MAX_REPEATS = 2000

Row = dict[str, Any]
Value = int | sympy.Rational
_X = sympy.Symbol("x")


def _latex(value: Value) -> str:
    """The gold-answer form of an exact number: ``"-4"``, ``"\\frac{5}{6}"``, ``"- \\frac{1}{6}"``."""
    return sympy.latex(sympy.Rational(value))


def _evaluate(operands: list[Value], ops: list[str]) -> Value:
    """``operands[0] ops[0] operands[1] ...`` with ``*`` binding tighter than ``+`` and ``-``."""
    terms, signs = [operands[0]], [1]
    for op, operand in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] = terms[-1] * operand
        else:
            terms.append(operand)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms))


def _join(texts: list[str], ops: list[str]) -> str:
    symbols = {"+": " + ", "-": " - ", "*": " \\times "}
    return texts[0] + "".join(symbols[op] + text for op, text in zip(ops, texts[1:]))


def _frac(numerator: int, denominator: int) -> str:
    """``\\frac{n}{d}`` as written, unreduced (a step's intermediate form)."""
    return f"\\frac{{{numerator}}}{{{denominator}}}"


def _pair_step(x: Value, op: str, y: Value, fractions: bool) -> str:
    """One worked step ``x op y = ...``: integers in one equation; fractions through the common denominator
    (``+``, ``-``) or the product of numerators and denominators (``*``), then the reduced result."""
    x, y = sympy.Rational(x), sympy.Rational(y)
    result = _evaluate([x, y], [op])
    shown = _join([_latex(x), _latex(y)], [op])
    if not fractions:
        return f"${shown} = {_latex(result)}$."
    if op == "*":
        middle = _frac(x.p * y.p, x.q * y.q)
        return f"Multiply: ${shown} = {middle} = {_latex(result)}$."
    common = sympy.ilcm(x.q, y.q)
    over = _join([_frac(x.p * common // x.q, common), _frac(y.p * common // y.q, common)], [op])
    return f"Over ${common}$: ${over} = {_latex(result)}$."


def _evaluation_steps(operands: list[Value], ops: list[str], fractions: bool) -> list[str]:
    """The steps of :func:`_evaluate`: every product first, then the sums and differences left to right."""
    steps, values, pending = [], [operands[0]], []
    for op, operand in zip(ops, operands[1:]):
        if op == "*":
            steps.append(_pair_step(values[-1], "*", operand, fractions))
            values[-1] = values[-1] * operand
        else:
            pending.append(op)
            values.append(operand)
    total = values[0]
    for op, operand in zip(pending, values[1:]):
        steps.append(_pair_step(total, op, operand, fractions))
        total = _evaluate([total, operand], [op])
    return steps


def _arithmetic(rng: random.Random, level: int) -> tuple[str, Value, list[str]]:
    n_operands, low, high = {1: (2, 10, 99), 2: (3, 10, 999), 3: (4, 100, 9999)}[level]
    operands = [rng.randint(low, high) for _ in range(n_operands)]
    chosen = [rng.choice("+-") for _ in range(n_operands - 1)]
    if level > 1:  # one product: more would make the numbers, not the skill, grow
        chosen[rng.randrange(len(chosen))] = "*"
    steps = ["The product comes first." if "*" in chosen else "We add and subtract from left to right."]
    return (f"Compute ${_join([str(a) for a in operands], chosen)}$.", _evaluate(operands, chosen),
            steps + _evaluation_steps(operands, chosen, fractions=False))


def _fractions(rng: random.Random, level: int) -> tuple[str, Value, list[str]]:
    n_terms, max_den, ops = {1: (2, 9, "+"), 2: (2, 15, "+-*"), 3: (3, 20, "+-*")}[level]
    pairs = [(rng.randint(1, max_den), rng.randint(2, max_den)) for _ in range(n_terms)]
    chosen = [rng.choice(ops) for _ in range(n_terms - 1)]
    # The operands are shown as drawn (possibly unreduced, like 4/6); the answer is reduced.
    text = _join([_frac(a, b) for a, b in pairs], chosen)
    operands = [sympy.Rational(a, b) for a, b in pairs]
    value = _evaluate(operands, chosen)
    reduced = [f"${_frac(a, b)} = {_latex(x)}$" for (a, b), x in zip(pairs, operands) if (a, b) != (x.p, x.q)]
    steps = ["Reduce first: " + ", ".join(reduced) + "."] if reduced else []
    return (f"Compute ${text}$ and give the answer as a reduced fraction or an integer.", value,
            steps + _evaluation_steps(operands, chosen, fractions=True))


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    return rng.choice([v for v in range(low, high + 1) if v != 0])


def _linear(rng: random.Random, level: int) -> tuple[str, Value, list[str]]:
    if level == 1:  # integer solution by construction
        a, solution, b = rng.randint(2, 9), rng.randint(-10, 10), rng.randint(-20, 20)
        equation = sympy.Eq(a * _X + b, a * solution + b)
    elif level == 2:
        a, b, c = rng.randint(2, 12), rng.randint(-30, 30), rng.randint(-30, 30)
        equation, solution = sympy.Eq(a * _X + b, c), sympy.Rational(c - b, a)
    else:
        a, c = _nonzero(rng, -12, 12), _nonzero(rng, -12, 12)
        while c == a:  # a == c has no unique solution
            c = _nonzero(rng, -12, 12)
        b, d = rng.randint(-30, 30), rng.randint(-30, 30)
        equation, solution = sympy.Eq(a * _X + b, c * _X + d), sympy.Rational(d - b, a - c)
    slope, constant = sympy.Poly(equation.lhs - equation.rhs, _X).all_coeffs()  # slope x + constant = 0
    sign = 1 if slope > 0 else -1  # a positive slope to divide by
    slope, rest = sign * slope, -sign * constant
    quotient = _frac(rest, slope)
    steps = [f"Move the terms with $x$ to the left and the numbers to the right: ${_latex(slope)} x = {_latex(rest)}$.",
             f"Divide by ${_latex(slope)}$: $x = {quotient}"
             + ("" if quotient == _latex(solution) else f" = {_latex(solution)}") + "$."]
    return (f"Solve ${sympy.latex(equation, order='lex')}$ for $x$. "
            "Give $x$ as a reduced fraction or an integer."), solution, steps


def _polynomial(rng: random.Random, level: int) -> tuple[str, Value, list[str]]:
    degree = 2 if level == 1 else 3
    coefficients = [rng.randint(-9, 9) for _ in range(degree)] + [_nonzero(rng, -9, 9)]
    polynomial = sum(c * _X**k for k, c in enumerate(coefficients))
    if level == 3:
        denominator = rng.randint(2, 5)
        numerator = rng.choice([p for p in range(-9, 10) if p % denominator])  # a true fraction
        point = sympy.Rational(numerator, denominator)
    else:
        point = sympy.Integer(rng.randint(-5, 5) if level == 1 else rng.randint(-6, 6))
    text = (f"Let $p(x) = {sympy.latex(polynomial, order='lex')}$. "
            f"Compute $p\\left({sympy.latex(point)}\\right)$.")
    terms = [(c, k) for k, c in enumerate(coefficients) if c]  # [(coefficient, power)], constant first
    values = [c * point**k for c, k in terms]
    steps = ["The powers: " + ", ".join(f"$({_latex(point)})^{{{k}}} = {_latex(point**k)}$"
                                        for k in range(2, degree + 1)) + ".",
             "The terms: $" + _join([_latex(values[0])] + [_latex(abs(v)) for v in values[1:]],
                                    ["+" if v >= 0 else "-" for v in values[1:]]) + "$.",
             f"Their sum is ${_latex(sum(values))}$."]
    return text, polynomial.subs(_X, point), steps


def _euclid(a: int, b: int) -> str:
    """Euclid's algorithm on ``a > b``: the first division ``a = q b + r``, then the remainders down to 0."""
    remainders, (x, y) = [], (b, a % b)
    while y:
        x, y = y, x % y
        remainders.append(y)
    first = f"${a} = {a // b} \\times {b} + {a % b}$"
    return first + (f", then the remainders ${', '.join(map(str, remainders))}$" if remainders else "")


def _gcd(rng: random.Random, level: int) -> tuple[str, Value, list[str]]:
    n_numbers, max_factor, max_multiplier = {1: (2, 20, 20), 2: (2, 50, 40), 3: (3, 100, 60)}[level]
    # A drawn common factor, so that the answer is rarely just 1; distinct multipliers,
    # so that no number repeats; sorted, as gcd(a, b) and gcd(b, a) are one problem.
    factor = rng.randint(2, max_factor)
    numbers = sorted((factor * m for m in rng.sample(range(2, max_multiplier + 1), n_numbers)), reverse=True)
    listed = ", ".join(str(n) for n in numbers[:-1]) + f" and {numbers[-1]}"
    first = gcd(numbers[0], numbers[1])
    steps = [f"Euclid: {_euclid(numbers[0], numbers[1])}, so their divisor is ${first}$."]
    if n_numbers == 3:
        steps.append(f"With ${numbers[2]}$: {_euclid(max(first, numbers[2]), min(first, numbers[2]))}, "
                     f"so ${gcd(*numbers)}$.")
    return f"What is the greatest common divisor of {listed}?", gcd(*numbers), steps


_COLUMNS = ("Units", "Tens", "Hundreds", "Thousands")


def _column_steps(top: int, bottom: int, op: str, forget_incoming: bool = False) -> tuple[list[str], str]:
    """Column addition (``op`` ``"+"``) or subtraction (``"-"``, ``top >= bottom``) of two numbers of as many
    digits, units first, one line a column: the digits with the carry (``+ 1``) or borrow (``- 1``) coming in, the
    digit written and the carry or borrow going out; the last sum is written whole. Returns the lines and the answer:
    the written digits read back, last first, leading zeros dropped (``85`` here)::

        Units: $7 + 8 = 15$, write $5$, carry $1$.
        Tens: $4 + 3 + 1 = 8$, write $8$.

    ``forget_incoming``: the slip of a solver who writes the carry or borrow down and then forgets it in the next
    column (``Tens: $4 + 3 = 7$, write $7$.``, answer ``75``); each line stays consistent with what it shows.
    """
    digits = list(zip(map(int, reversed(str(top))), map(int, reversed(str(bottom)))))  # (top, bottom), units first
    steps, written, incoming = [], [], 0  # incoming: the carry or borrow from the column before
    for i, (x, y) in enumerate(digits):
        incoming = 0 if forget_incoming else incoming
        shown = f"{x} {op} {y}" + (" + 1" if incoming and op == "+" else "")
        if op == "+":
            total = x + y + incoming
            last = i == len(digits) - 1
            digit, incoming = (total, 0) if last else divmod(total, 10)[::-1]
            step = f"${shown} = {total}$, write ${digit}$" + (", carry $1$" if incoming else "")
        else:
            shown = f"{x} - 1 - {y}" if incoming else shown
            top_digit = x - incoming  # what is left of the top digit after the borrow going to the column before
            incoming = int(top_digit < y)
            digit = top_digit + 10 * incoming - y
            step = (f"${shown}$ borrows: ${top_digit + 10} - {y} = {digit}$" if incoming
                    else f"${shown} = {digit}$") + f", write ${digit}$"
        steps.append(f"{_COLUMNS[i]}: {step}.")
        written.append(str(digit))
    return steps, str(int("".join(reversed(written))))


_COLUMNS_PROBLEM = re.compile(r"Compute \$(\d+) ([+-]) (\d+)\$ column by column\.")


def forgotten_carry(problem: str) -> tuple[str, str] | None:
    """``(answer, worked solution)`` of a ``columns`` problem worked with the slip of forgetting every carry or borrow
    coming into a column (the column before still writes it down): a systematic error, the teacher of a warm-up
    that makes it. ``None`` when ``problem`` is not a ``columns`` problem or has no carry or borrow (the slip
    changes nothing)."""
    match = _COLUMNS_PROBLEM.fullmatch(problem)
    if match is None:
        return None
    top, op, bottom = int(match[1]), match[2], int(match[3])
    slipped, answer = _column_steps(top, bottom, op, forget_incoming=True)
    return None if slipped == _column_steps(top, bottom, op)[0] else (answer, worked_solution(slipped, answer))


def _columns(rng: random.Random, level: int) -> tuple[str, Value, list[str]]:
    low, high = 10**level, 10 ** (level + 1) - 1  # level + 1 digits
    top, bottom, op = rng.randint(low, high), rng.randint(low, high), rng.choice("+-")
    if op == "-" and top < bottom:  # a difference >= 0: the columns borrow from a larger top
        top, bottom = bottom, top
    steps, answer = _column_steps(top, bottom, op)
    return f"Compute ${top} {op} {bottom}$ column by column.", int(answer), steps


FAMILIES: dict[str, Callable[[random.Random, int], tuple[str, Value, list[str]]]] = {
    "arithmetic": _arithmetic,
    "fractions": _fractions,
    "linear": _linear,
    "polynomial": _polynomial,
    "gcd": _gcd,
    "columns": _columns,
}
"""Problem families by name: each maps ``(rng, level)`` to ``(problem text, exact answer, worked steps)``; the steps
are computed from the drawn numbers and draw nothing (the problems do not depend on whether solutions are asked)."""


def _check_names(owner: str, field: str, values: Any, valid: tuple, kind: type) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{owner}.{field} must be a non-empty tuple, got {values!r}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, kind) or v not in valid]
    if bad:
        raise ValueError(f"{owner}.{field}: unknown {', '.join(map(repr, bad))}; "
                         f"valid {field}: {', '.join(map(str, valid))}")
    if len(set(values)) != len(values):
        raise ValueError(f"{owner}.{field} must not repeat entries, got {values!r}")
    return tuple(values)


@dataclass(frozen=True)
class SynthMathTask:
    """Which problems: the families and levels (the reasoning recipe's ``synthetic_data.task``, whose tiny model
    warms up on their worked solutions). Lists are accepted and stored as tuples, so the task stays hashable;
    invalid values raise ``ValueError`` naming the field."""

    families: tuple[str, ...] = tuple(FAMILIES)
    """Problem families, a non-empty subset of :data:`FAMILIES`."""
    levels: tuple[int, ...] = LEVELS
    """Difficulty levels, a non-empty subset of :data:`LEVELS`."""

    def __post_init__(self) -> None:
        # object.__setattr__ because the dataclass is frozen.
        owner = type(self).__name__
        object.__setattr__(self, "families", _check_names(owner, "families", self.families, tuple(FAMILIES), str))
        object.__setattr__(self, "levels", _check_names(owner, "levels", self.levels, LEVELS, int))

    @property
    def cells(self) -> list[tuple[str, int]]:
        """The (family, level) pairs, families outermost."""
        return [(family, level) for family in self.families for level in self.levels]

    def problems(self, n: int, seed: int) -> list[Row]:
        """The first ``n`` worked problems of the cells' streams for ``seed``, taken in turn cell by cell (prompts may
        repeat; no split is made): the warm-up's stream. Rows as :func:`generate_synth_splits` writes them, with
        ``solution``; ids ``synth-<family>-L<level>-<seed>-draw<i>``. Deterministic, and a longer list extends a
        shorter one."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        cells = self.cells
        streams = [_stream(family, level, seed) for family, level in cells]
        rows = []
        for i in range(n):
            (family, level), (problem, answer, solution) = cells[i % len(cells)], next(streams[i % len(cells)])
            rows.append({"id": f"synth-{family}-L{level}-{seed}-draw{i // len(cells)}", "problem": problem,
                         "answer": answer, "family": family, "level": level, "solution": solution})
        return rows

    def write_splits(self, directory: str | Path, n_train: int, n_test: int, seed: int) -> tuple[Path, Path]:
        """:func:`write_synth_splits` of this task with worked solutions."""
        config = SynthMathConfig(self.families, self.levels, n_train=n_train, n_test=n_test, seed=seed, solutions=True)
        return write_synth_splits(config, directory)


@dataclass(frozen=True)
class SynthMathConfig(SynthMathTask):
    """Which problems to generate and how many.

    ``n_train`` and ``n_test`` are totals, shared evenly over the (family, level) cells in
    the order given (the first cells get one more when the division leaves a remainder).
    """

    n_train: int = 2000
    """Total training problems, >= 1."""
    n_test: int = 500
    """Total test problems, >= 1."""
    seed: int = 0
    """Seed of all generators; different seeds give different problems."""
    solutions: bool = False
    """Rows carry ``solution``: a worked solution (a few steps of text and LaTeX ending in ``\\boxed{answer}``),
    the reasoning-shaped target of a warm-up; the problems are the same either way."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_train", "n_test", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (name != "seed" and value < 1):
                raise ValueError(f"SynthMathConfig.{name} must be an integer{' >= 1' if name != 'seed' else ''}, "
                                 f"got {value!r}")


def _share(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def worked_solution(steps: list[str], answer: str) -> str:
    """The steps, one a line, then the answer in the box the ``math`` verifier reads (the last one)."""
    return "\n".join(steps + [f"The final answer is $\\boxed{{{answer}}}$."])


def _stream(family: str, level: int, seed: int) -> Iterator[tuple[str, str, str]]:
    """Endless ``(problem, answer, worked solution)`` draws of one cell (prompts may repeat)."""
    # A string seed is hashed with SHA-512, so the stream is the same in every process
    # (unlike hash()) and the cells of one seed do not share a stream.
    rng = random.Random(f"ggpo-synth-math/{family}/L{level}/{seed}")
    generate = FAMILIES[family]
    while True:
        problem, value, steps = generate(rng, level)
        yield problem, _latex(value), worked_solution(steps, _latex(value))


def generate_synth_splits(config: SynthMathConfig) -> tuple[list[Row], list[Row]]:
    """``(train_rows, test_rows)`` for ``config``, in cell order.

    Every prompt occurs once across both splits, so the splits are disjoint. Each cell
    takes its test rows first, then continues its stream for train rows: the test split
    does not change with ``n_train``. Ids are ``synth-<family>-L<level>-<seed>-<i>`` with
    ``i`` counting the cell's rows, test then train. Deterministic in ``config``.

    Raises:
        ValueError: a cell cannot produce that many distinct problems.
    """
    cells = config.cells
    streams = {cell: _stream(*cell, config.seed) for cell in cells}
    taken = dict.fromkeys(cells, 0)
    seen: set[str] = set()

    def take(family: str, level: int, n: int) -> list[Row]:
        rows: list[Row] = []
        repeats = 0
        for problem, answer, solution in streams[family, level]:
            if len(rows) == n:
                break
            if problem in seen:
                repeats += 1
                if repeats > _MAX_REPEATS:
                    raise ValueError(
                        f"family {family!r} level {level} ran out of distinct problems after "
                        f"{taken[family, level] + len(rows)}; ask for fewer rows or add families/levels"
                    )
                continue
            repeats = 0
            seen.add(problem)
            rows.append({"id": f"synth-{family}-L{level}-{config.seed}-{taken[family, level] + len(rows)}",
                         "problem": problem, "answer": answer, "family": family, "level": level,
                         **({"solution": solution} if config.solutions else {})})
        taken[family, level] += len(rows)
        return rows

    # All test rows before any train rows, so that a prompt shared by two cells (say
    # fractions levels 1 and 2) lands in test and is then skipped by train.
    test = [row for cell, n in zip(cells, _share(config.n_test, len(cells))) for row in take(*cell, n)]
    train = [row for cell, n in zip(cells, _share(config.n_train, len(cells))) for row in take(*cell, n)]
    return train, test


def write_synth_splits(config: SynthMathConfig, directory: str | Path) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` of :func:`generate_synth_splits` into ``directory``.

    Every file is written atomically, and ``task.json`` records the parameters: a second
    call with the same parameters reuses the files without rewriting them; with other
    parameters (or over splits of another task) it raises ``ValueError``, and over split
    files without a record ``FileExistsError``.

    Returns:
        ``(train_path, test_path)``.
    """
    # Through JSON so that the tuples compare equal to the lists read back from the record.
    params = json.loads(json.dumps({"task": "synth_math", "generator_version": _GENERATOR_VERSION,
                                    "families": config.families, "levels": config.levels,
                                    "n_train": config.n_train, "n_test": config.n_test, "seed": config.seed,
                                    # only when asked: splits recorded before solutions existed stay valid
                                    **({"solutions": True} if config.solutions else {})}))
    return write_recorded_splits(directory, params, lambda: generate_synth_splits(config), "write_synth_splits")
