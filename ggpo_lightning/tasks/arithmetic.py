"""Synthetic arithmetic problems: ``"17+25="`` with gold answer ``"42"``.

Problems are procedurally generated from a seed, so a run needs no downloads and its
data is reproducible. Rows are plain dicts ``{"id", "prompt", "answer"}``, the same
shape as the JSONL prompt files of the trainer. This module does not import torch.

Typical use::

    task = ArithmeticTask(max_operand=99, ops="+")
    train_file, test_file = write_splits(task, "runs/data", n_train=4096, n_test=512, seed=0)
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

from ggpo_lightning.records.atomic import atomic_write_text
from ggpo_lightning.records.errors import FolderInUseError, SettingsError

__all__ = ["ArithmeticTask", "write_splits"]

OPERATORS = "+-*"
SPLITS_RECORD = "task.json"
# Bump when the rows generated for given parameters change: cached splits recorded with
# another version are then reported as stale instead of silently reused.
_GENERATOR_VERSION = 1

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class ArithmeticTask:
    """Problems ``a<op>b=`` with integer operands drawn uniformly from ``0..max_operand``.

    The gold answer is the exact integer result as a decimal string (negative for
    ``-`` when ``b > a``). Frozen, so that it can be the default of other config
    dataclasses and be compared and recorded.
    """

    max_operand: int = 99
    """Largest operand; operands are drawn uniformly from 0..max_operand."""
    ops: str = "+"
    """Operators to draw from uniformly: a non-empty subset of "+-*", e.g. "+-"."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.ops, str)
            or not self.ops
            or not set(self.ops) <= set(OPERATORS)
            or len(set(self.ops)) != len(self.ops)
        ):
            raise ValueError(
                f"ArithmeticTask.ops must be a non-empty string of distinct operators from "
                f"{OPERATORS!r}, got {self.ops!r}"
            )
        if isinstance(self.max_operand, bool) or not isinstance(self.max_operand, int) or self.max_operand < 1:
            raise ValueError(f"ArithmeticTask.max_operand must be an integer >= 1, got {self.max_operand!r}")

    @property
    def num_distinct_problems(self) -> int:
        """How many different prompts the task can produce."""
        return len(self.ops) * (self.max_operand + 1) ** 2

    def problems(self, n: int, seed: int) -> list[dict[str, str]]:
        """The first ``n`` problems of the stream for ``seed`` (prompts may repeat).

        Deterministic: the same ``(task, n, seed)`` gives the same rows, and a longer
        list extends a shorter one. Row ids are ``"arith-<seed>-<index>"``.
        """
        _check_count("n", n)
        return list(islice(self._stream(seed), n))

    def write_splits(self, directory: str | Path, n_train: int, n_test: int, seed: int) -> tuple[Path, Path]:
        """:func:`write_splits` of this task."""
        return write_splits(self, directory, n_train, n_test, seed)

    def _stream(self, seed: int) -> Iterator[dict[str, str]]:
        rng = random.Random(seed)
        index = 0
        while True:
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            op = rng.choice(self.ops)
            yield {"id": f"arith-{seed}-{index}", "prompt": f"{a}{op}{b}=", "answer": str(_APPLY[op](a, b))}
            index += 1


def _distinct(task: ArithmeticTask, seed: int, n: int, exclude: set[str]) -> list[dict[str, str]]:
    """The first ``n`` rows of the seed's stream whose prompts are new and not in ``exclude``."""
    seen = set(exclude)
    rows: list[dict[str, str]] = []
    for row in task._stream(seed):
        if len(rows) == n:
            break
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def _differences(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    return [
        f"{key}: recorded {recorded.get(key)!r}, requested {wanted.get(key)!r}"
        for key in sorted(set(recorded) | set(wanted))
        if recorded.get(key) != wanted.get(key)
    ]


def write_splits(
    task: ArithmeticTask, directory: str | Path, n_train: int, n_test: int, seed: int
) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` of distinct problems into ``directory``.

    Each split holds distinct prompts and no test prompt occurs in train. The test split
    comes from seed ``2 * seed + 1`` and train from ``2 * seed``, so different ``seed``
    values never share a stream. Every file is written atomically, and ``task.json``
    records the parameters: a second call with the same parameters reuses the files
    without rewriting them; with other parameters it raises ``SettingsError`` (a ``ValueError``).

    Returns:
        ``(train_path, test_path)``.
    """
    _check_count("n_train", n_train)
    _check_count("n_test", n_test)
    if n_train + n_test > task.num_distinct_problems:
        raise ValueError(
            f"n_train + n_test = {n_train + n_test} exceeds the {task.num_distinct_problems} distinct "
            f"problems of {task}; raise max_operand, add ops, or ask for fewer rows"
        )
    params = {"generator_version": _GENERATOR_VERSION, "task": asdict(task),
              "n_train": n_train, "n_test": n_test, "seed": seed}

    def make_rows() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        test_rows = _distinct(task, 2 * seed + 1, n_test, exclude=set())
        train_rows = _distinct(task, 2 * seed, n_train, exclude={row["prompt"] for row in test_rows})
        return train_rows, test_rows

    return write_recorded_splits(directory, params, make_rows, "write_splits")


def write_recorded_splits(directory: str | Path, params: dict[str, Any],
                          make_rows: Callable[[], tuple[list[dict], list[dict]]],
                          writer: str) -> tuple[Path, Path]:
    """Write ``train.jsonl`` / ``test.jsonl`` of ``make_rows()`` once, recorded by ``params``.

    ``params`` (JSON-able) go to ``task.json``; a later call with equal ``params`` reuses
    the files, with other ``params`` raises ``SettingsError`` (a ``ValueError``) naming the differences, and over
    split files without a record (not written by ``writer``) raises ``FolderInUseError`` (a ``FileExistsError``).
    Every file is written atomically; rows are made before anything is written.
    """
    directory = Path(directory)
    train_path, test_path, record_path = (directory / name for name in ("train.jsonl", "test.jsonl", SPLITS_RECORD))
    if record_path.exists():
        differences = _differences(json.loads(record_path.read_text(encoding="utf-8")), params)
        if differences:
            raise SettingsError(
                f"{directory} holds splits made with other parameters ({'; '.join(differences)}). "
                f"Delete {directory} to regenerate them, or choose another directory."
            )
        if train_path.exists() and test_path.exists():
            return train_path, test_path
    elif train_path.exists() or test_path.exists():
        raise FolderInUseError(
            f"{directory} holds train.jsonl or test.jsonl but no {SPLITS_RECORD}, so they were not written "
            f"by {writer}; delete them or choose another directory."
        )
    train_rows, test_rows = make_rows()  # before any write: it may raise
    directory.mkdir(parents=True, exist_ok=True)
    # The record goes first: once it exists, missing split files are ours to (re)write.
    atomic_write_text(record_path, json.dumps(params, indent=2, sort_keys=True) + "\n")
    for path, rows in ((train_path, train_rows), (test_path, test_rows)):
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    return train_path, test_path
