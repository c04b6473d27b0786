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
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Any, Callable, Iterator

import sympy

from ggpo_lightning.tasks.arithmetic import write_recorded_splits

__all__ = ["FAMILIES", "LEVELS", "SynthMathConfig", "generate_synth_splits", "write_synth_splits"]

LEVELS = (1, 2, 3)
# Bump when the rows generated for given parameters change: splits recorded with another
# version are then reported as stale instead of silently reused.
_GENERATOR_VERSION = 1
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


def _arithmetic(rng: random.Random, level: int) -> tuple[str, Value]:
    n_operands, low, high = {1: (2, 10, 99), 2: (3, 10, 999), 3: (4, 100, 9999)}[level]
    operands = [rng.randint(low, high) for _ in range(n_operands)]
    chosen = [rng.choice("+-") for _ in range(n_operands - 1)]
    if level > 1:  # one product: more would make the numbers, not the skill, grow
        chosen[rng.randrange(len(chosen))] = "*"
    return f"Compute ${_join([str(a) for a in operands], chosen)}$.", _evaluate(operands, chosen)


def _fractions(rng: random.Random, level: int) -> tuple[str, Value]:
    n_terms, max_den, ops = {1: (2, 9, "+"), 2: (2, 15, "+-*"), 3: (3, 20, "+-*")}[level]
    pairs = [(rng.randint(1, max_den), rng.randint(2, max_den)) for _ in range(n_terms)]
    chosen = [rng.choice(ops) for _ in range(n_terms - 1)]
    # The operands are shown as drawn (possibly unreduced, like 4/6); the answer is reduced.
    text = _join([f"\\frac{{{a}}}{{{b}}}" for a, b in pairs], chosen)
    value = _evaluate([sympy.Rational(a, b) for a, b in pairs], chosen)
    return f"Compute ${text}$ and give the answer as a reduced fraction or an integer.", value


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    return rng.choice([v for v in range(low, high + 1) if v != 0])


def _linear(rng: random.Random, level: int) -> tuple[str, Value]:
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
    return (f"Solve ${sympy.latex(equation, order='lex')}$ for $x$. "
            "Give $x$ as a reduced fraction or an integer."), solution


def _polynomial(rng: random.Random, level: int) -> tuple[str, Value]:
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
    return text, polynomial.subs(_X, point)


def _gcd(rng: random.Random, level: int) -> tuple[str, Value]:
    n_numbers, max_factor, max_multiplier = {1: (2, 20, 20), 2: (2, 50, 40), 3: (3, 100, 60)}[level]
    # A drawn common factor, so that the answer is rarely just 1; distinct multipliers,
    # so that no number repeats; sorted, as gcd(a, b) and gcd(b, a) are one problem.
    factor = rng.randint(2, max_factor)
    numbers = sorted((factor * m for m in rng.sample(range(2, max_multiplier + 1), n_numbers)), reverse=True)
    listed = ", ".join(str(n) for n in numbers[:-1]) + f" and {numbers[-1]}"
    return f"What is the greatest common divisor of {listed}?", gcd(*numbers)


FAMILIES: dict[str, Callable[[random.Random, int], tuple[str, Value]]] = {
    "arithmetic": _arithmetic,
    "fractions": _fractions,
    "linear": _linear,
    "polynomial": _polynomial,
    "gcd": _gcd,
}
"""Problem families by name: each maps ``(rng, level)`` to ``(problem text, exact answer)``."""


def _check_names(field: str, values: Any, valid: tuple, kind: type) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"SynthMathConfig.{field} must be a non-empty tuple, got {values!r}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, kind) or v not in valid]
    if bad:
        raise ValueError(f"SynthMathConfig.{field}: unknown {', '.join(map(repr, bad))}; "
                         f"valid {field}: {', '.join(map(str, valid))}")
    if len(set(values)) != len(values):
        raise ValueError(f"SynthMathConfig.{field} must not repeat entries, got {values!r}")
    return tuple(values)


@dataclass(frozen=True)
class SynthMathConfig:
    """Which problems to generate and how many.

    ``n_train`` and ``n_test`` are totals, shared evenly over the (family, level) cells in
    the order given (the first cells get one more when the division leaves a remainder).
    Lists are accepted for ``families`` and ``levels`` and stored as tuples, so the config
    stays hashable. Invalid values raise ``ValueError`` naming the field.
    """

    families: tuple[str, ...] = tuple(FAMILIES)
    """Problem families, a non-empty subset of :data:`FAMILIES`."""
    levels: tuple[int, ...] = LEVELS
    """Difficulty levels, a non-empty subset of :data:`LEVELS`."""
    n_train: int = 2000
    """Total training problems, >= 1."""
    n_test: int = 500
    """Total test problems, >= 1."""
    seed: int = 0
    """Seed of all generators; different seeds give different problems."""

    def __post_init__(self) -> None:
        # object.__setattr__ because the dataclass is frozen.
        object.__setattr__(self, "families", _check_names("families", self.families, tuple(FAMILIES), str))
        object.__setattr__(self, "levels", _check_names("levels", self.levels, LEVELS, int))
        for name in ("n_train", "n_test", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (name != "seed" and value < 1):
                raise ValueError(f"SynthMathConfig.{name} must be an integer{' >= 1' if name != 'seed' else ''}, "
                                 f"got {value!r}")

    @property
    def cells(self) -> list[tuple[str, int]]:
        """The (family, level) pairs, families outermost."""
        return [(family, level) for family in self.families for level in self.levels]


def _share(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _stream(family: str, level: int, seed: int) -> Iterator[tuple[str, str]]:
    """Endless ``(problem, answer)`` draws of one cell (prompts may repeat)."""
    # A string seed is hashed with SHA-512, so the stream is the same in every process
    # (unlike hash()) and the cells of one seed do not share a stream.
    rng = random.Random(f"ggpo-synth-math/{family}/L{level}/{seed}")
    generate = FAMILIES[family]
    while True:
        problem, value = generate(rng, level)
        yield problem, _latex(value)


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
        for problem, answer in streams[family, level]:
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
                         "problem": problem, "answer": answer, "family": family, "level": level})
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
                                    "n_train": config.n_train, "n_test": config.n_test, "seed": config.seed}))
    return write_recorded_splits(directory, params, lambda: generate_synth_splits(config), "write_synth_splits")
