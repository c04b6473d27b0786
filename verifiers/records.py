"""The records every layer of ``ggpo_verifiers`` shares: a check's ``Status`` and
``Outcome``, and ``GoldAnswerError``.

They live in their own module so that ``base`` (the ``Verifier`` contract) and ``pool``
(the worker processes) both import them without importing each other. This module imports
nothing of the package.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Status(enum.IntEnum):
    """Outcome of one check (a small integer: it crosses the worker boundary)."""

    CORRECT = 0
    WRONG = 1
    UNPARSEABLE = 2
    TIMEOUT = 3
    CRASHED = 4
    BAD_GOLD = 5


class Outcome(NamedTuple):
    """Score of one response and how it was reached."""

    score: float
    status: Status


class GoldAnswerError(ValueError):
    """A gold answer the verifier cannot use. It is the dataset's fault, not the model's.

    ``gold`` is the offending text, ``reason`` says why, ``index`` is its position in
    the sequence given to ``validate_golds`` (None for a single gold). Data loaders
    catch it and add the file and line of the row.
    """

    def __init__(self, gold: str, reason: str, index: int | None = None) -> None:
        self.gold = gold
        self.reason = reason
        self.index = index
        where = "" if index is None else f" (gold #{index})"
        shown = gold if len(gold) <= 200 else gold[:200] + "..."
        # Quoted but not repr()'d: LaTeX backslashes should read as the dataset has them.
        shown = shown.replace("\n", " ")
        super().__init__(f"unusable gold answer '{shown}'{where}: {reason}")


__all__ = ["GoldAnswerError", "Outcome", "Status"]
