"""The one prompt schema and the dataset layouts that convert to it, torch-free.

The schema, read by training (``data.*``) and ``ggpo eval`` alike: one JSON object per row with ``prompt`` (the
problem text) and ``answer`` (the bare gold answer, already extracted: ``\\frac{1}{2}``, ``72``), optionally
``id`` and ``messages`` (a conversation, ``[{"role": ..., "content": ...}]``, for chat-template models), plus
whatever other fields the source had. ``ggpo data convert`` writes it; ``data.format`` (and ``ggpo eval
--format``) reads the same layouts directly, through the same :func:`to_schema`.

The layouts (:data:`FORMATS`):

- ``prompt-answer``: the schema itself; the fields are named by ``prompt_field`` / ``answer_field``, the gold is
  taken as it is (a list of answers joined by ``, ``).
- ``math`` (MATH, MATH-500): ``problem`` (else ``prompt_field``), ``solution`` with a ``\\boxed{}`` answer, optional ``answer`` (which,
  when present and not empty, is the gold).
- ``gsm8k``: ``question``, ``answer`` a worked solution ending ``#### 72``.
- ``verl`` (DAPO-Math-17k as it ships): ``prompt`` a list of chat messages, the gold in
  ``reward_model.ground_truth``.

A worked solution's gold is what ``ggpo_verifiers.gold_from_solution(..., solution=True)`` reads (the package's one
gold extraction): a solution marking no answer gives none, and its row is an error naming the line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ggpo_verifiers import GoldAnswerError, gold_from_solution

from ggpo_lightning.records.errors import DataError

__all__ = ["FORMATS", "convert_records", "detect_format", "to_schema"]

FORMATS = ("prompt-answer", "math", "gsm8k", "verl")
"""The layouts :func:`to_schema` reads (``data.format``, ``ggpo data convert --format``)."""


def _gold(solution: Any, field: str, where: str) -> str:
    """The gold that the worked solution in ``field`` marks (``ggpo_verifiers.gold_from_solution``, the package's
    one gold extraction), or a :class:`DataError` naming ``where`` and the field when it marks none."""
    try:
        return gold_from_solution(str(solution), solution=True)
    except GoldAnswerError as exc:
        raise DataError(f"{where}: field {field!r} gives no gold: {exc.reason}") from exc


def _require(record: dict[str, Any], field: str, where: str, hint: str) -> Any:
    value = record.get(field)
    if value is None:
        raise DataError(f"{where}: missing field {field!r} (fields: {', '.join(sorted(record))}); {hint}")
    return value


def to_schema(record: dict[str, Any], format: str, where: str, prompt_field: str = "prompt",
              answer_field: str = "answer", hint: str = "map yours with data.prompt_field / data.answer_field, "
              "or choose the layout with data.format") -> dict[str, Any]:
    """``record`` of layout ``format`` as a schema row: ``prompt`` and ``answer`` (the extracted gold), the
    source's other fields kept (a field the prompt or gold was read from under another name is dropped, a GSM8K
    worked answer is kept as ``solution``, verl's message list as ``messages``).

    ``prompt_field`` / ``answer_field`` name the fields of the ``prompt-answer`` layout (the other layouts have
    fixed names). A row without its fields, with an empty prompt or without a gold is a :class:`DataError`
    naming ``where`` (``file:line``) and ending with ``hint``.
    """
    if format == "prompt-answer":
        prompt, answer = _require(record, prompt_field, where, hint), _require(record, answer_field, where, hint)
        if isinstance(answer, list):  # several final answers (OlympiadBench): one gold, as a list
            answer = ", ".join(map(str, answer))
        row = {k: v for k, v in record.items() if k not in (prompt_field, answer_field)}
        extra: dict[str, Any] = {}
    elif format == "math":
        prompt = _require(record, "problem" if "problem" in record else prompt_field, where, hint)
        answer = record.get("answer")
        if answer is None or not str(answer).strip():
            if record.get("solution") is None:
                raise DataError(f"{where}: missing field 'answer' (or a 'solution' with a \\boxed{{}} answer; "
                                f"fields: {', '.join(sorted(record))}); {hint}")
            answer = _gold(record["solution"], "solution", where)
        row, extra = {k: v for k, v in record.items() if k not in ("problem", prompt_field, "answer")}, {}
    elif format == "gsm8k":
        prompt, worked = _require(record, "question", where, hint), _require(record, "answer", where, hint)
        answer = _gold(worked, "answer", where)
        row, extra = {k: v for k, v in record.items() if k not in ("question", "answer")}, {"solution": worked}
    elif format == "verl":
        messages = _require(record, "prompt", where, hint)
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"] \
            if isinstance(messages, list) else []
        if not users or not isinstance(users[-1], str):
            raise DataError(f"{where}: verl layout: 'prompt' must be a list of chat messages with a user turn "
                            f"({{'role': 'user', 'content': ...}}), got {str(messages)[:80]!r}")
        truth = (record.get("reward_model") or {}).get("ground_truth")
        if truth is None:
            raise DataError(f"{where}: verl layout: no reward_model.ground_truth (fields: "
                            f"{', '.join(sorted(record))}); fix or drop the row")
        prompt, answer = users[-1], truth
        row, extra = {k: v for k, v in record.items() if k != "prompt"}, {"messages": messages}
    else:
        raise DataError(f"unknown data format {format!r}; choose one of {', '.join(FORMATS)}")
    if not str(prompt).strip():
        raise DataError(f"{where}: the prompt is empty; fill or drop the row")
    kept = {k: v for k, v in {**row, **extra}.items() if k not in ("prompt", "answer")}  # the read fields win
    return {"prompt": str(prompt), "answer": str(answer).strip(), **kept}


def detect_format(record: dict[str, Any]) -> str | None:
    """The layout of ``record`` as ``ggpo eval`` guesses it from a file's first row, or None for the
    ``prompt-answer`` layout (its fields then found by name).

    verl (a message list and ``reward_model``), MATH (``problem`` with ``answer``, or a ``solution`` without
    ``answer``), GSM8K
    (``question`` with an ``answer`` holding ``####``).
    """
    if isinstance(record.get("prompt"), list) and "reward_model" in record:
        return "verl"
    if ("problem" in record and "answer" in record) or ("solution" in record and "answer" not in record):
        return "math"
    if "question" in record and "####" in str(record.get("answer", "")):
        return "gsm8k"
    return None


def convert_records(records: Iterable[tuple[str, dict[str, Any]]], format: str, verifier: Any,
                    prompt_field: str = "prompt", answer_field: str = "answer",
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """Schema rows of ``(where, record)`` pairs of layout ``format``, and what was left out.

    Returns ``(rows, left_out)``: ``left_out`` holds one line per dropped record, ``where: reason``, for a record
    whose prompt or gold cannot be read (:func:`to_schema`) or whose gold ``verifier`` cannot use
    (``validate_golds``): such rows are reported and dropped here, never kept to be scored 0 in training.
    """
    rows, wheres, positions, left_out = [], [], [], []
    for position, (where, record) in enumerate(records):
        try:
            rows.append(to_schema(record, format, where, prompt_field, answer_field,
                                  hint="map yours with --prompt-field / --answer-field, or choose another --format"))
            wheres.append(where)
            positions.append(position)
        except DataError as exc:
            left_out.append((position, str(exc)))
    keep = [True] * len(rows)
    start = 0
    while start < len(rows):  # the verifier names the first bad gold: resume after it
        try:
            verifier.validate_golds([row["answer"] for row in rows[start:]])
            break
        except GoldAnswerError as exc:
            bad = start + exc.index
            keep[bad] = False
            left_out.append((positions[bad], f"{wheres[bad]}: gold {rows[bad]['answer']!r}: {exc.reason}"))
            start = bad + 1
    return [row for row, kept in zip(rows, keep) if kept], [message for _, message in sorted(left_out)]
