"""Prompt records, torch-free: prompt rows, the JSONL/Parquet/``datasets`` readers, gold validation.

The bottom layer of the package (nothing here imports torch or Lightning): the trainer's
DataModule, ``ggpo eval`` and the rollout all read prompts through these functions, so a
bad record is reported the same way everywhere, naming ``file:line``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggpo_lightning.records.errors import DataError, MissingFileError
from ggpo_lightning.records.extras import require
from ggpo_lightning.records.formats import to_schema

PAPER_TEMPLATE = "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}.\n"
"""The prompt template of the paper's math setup (a Python format string; ``{{}}`` is a literal ``{}``): the
recipes' ``data.prompt_template``, the benchmarks' and the reasoning task's."""

__all__ = ["PAPER_TEMPLATE", "PromptRow", "load_dataset_rows", "load_prompt_rows", "read_records", "read_source",
           "validate_golds"]


@dataclass(frozen=True)
class PromptRow:
    """One prompt with its gold answer; ``source`` is ``file:line`` for error messages."""

    id: str
    prompt: str
    gold: str
    source: str = ""
    messages: tuple[dict[str, Any], ...] | None = None
    """The row's conversation (``messages`` in the data), for a chat template; the prompt is its last user turn."""


def read_records(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line or row number, record)`` pairs of a JSONL or Parquet file.

    A line that is not UTF-8 or not a JSON object is a ValueError naming ``file:line``.
    """
    if path.suffix == ".parquet":
        require("pyarrow", f"{path} (a Parquet file)")
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), start=1)
        return
    with open(path, "rb") as f:  # bytes: a decoding error names its line
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{number}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                                "re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            yield number, record


TRAIN_HINT = "map yours with data.prompt_field / data.answer_field, or choose the layout with data.format"
"""How ``ggpo-train`` says to fix a row without the fields (``ggpo eval`` names its flags instead)."""


def read_source(path: Path, split: str = "train") -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` pairs of a local JSONL or Parquet file (``where`` = ``file:line``), or of a ``datasets``
    ``save_to_disk`` folder (``folder[split]:index``; a DatasetDict's ``split``, a Dataset as it is)."""
    if not path.is_dir():
        if not path.is_file():
            raise DataError(f"{path} does not exist")
        for number, record in read_records(path):
            yield f"{path}:{number}", record
        return
    require("datasets", f"{path} (a save_to_disk folder)")
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r} (splits: {', '.join(loaded)}); choose one with --split")
        loaded = loaded[split]
    for index, record in enumerate(loaded):
        yield f"{path}[{split}]:{index}", record


def load_prompt_rows(path: str | os.PathLike, prompt_field: str = "prompt", answer_field: str = "answer",
                     id_field: str | None = "id", template: str = "{prompt}", format: str = "prompt-answer",
                     hint: str = TRAIN_HINT, limit: int | None = None) -> list[PromptRow]:
    """Read prompts and gold answers from a JSONL or Parquet file of layout ``format``
    (:data:`~ggpo_lightning.records.formats.FORMATS`; each record goes through
    :func:`~ggpo_lightning.records.formats.to_schema`, which extracts the gold once).

    ``template`` is formatted with the schema row's fields (``{prompt}`` is the prompt). A
    record without its fields, whose prompt is empty or whitespace only, or without a gold is
    a :class:`~ggpo_lightning.records.errors.DataError` naming the file, the line and the
    fields it does have (then ``hint``). ``limit`` reads only the first N records of a JSONL file (the lines after
    them are not read, let alone checked).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"prompt file {path} does not exist")
    records = ((f"{path}:{number}", f"{path.name}:{number}", record)
               for number, record in itertools.islice(read_records(path), limit))
    return _rows(records, str(path), prompt_field, answer_field, id_field, template, format, hint)


def load_dataset_rows(name: str, split: str, config_name: str | None = None, prompt_field: str = "problem",
                      answer_field: str = "answer", id_field: str | None = "id",
                      template: str = "{prompt}", format: str = "prompt-answer") -> list[PromptRow]:
    """Prompts and gold answers from a Hugging Face ``datasets`` dataset (a hub name or a local path) of layout
    ``format``.

    Uses ``datasets.load_dataset(name, config_name, split=split)``, so with
    ``HF_HUB_OFFLINE=1`` only cached or local datasets load. Errors name the row as
    ``name[split]:index``.
    """
    require("datasets", f"data.dataset {name!r}")
    import datasets

    table = datasets.load_dataset(name, config_name, split=split)
    label = f"{name}[{split}]"
    records = ((f"{label}:{i}", f"{label}:{i}", record) for i, record in enumerate(table))
    return _rows(records, label, prompt_field, answer_field, id_field, template, format, TRAIN_HINT)


def _rows(records: Iterable[tuple[str, str, dict]], label: str, prompt_field: str, answer_field: str,
          id_field: str | None, template: str, format: str, hint: str) -> list[PromptRow]:
    """PromptRows of ``(where, default id, record)`` triples; errors name ``where``."""
    rows = []
    for where, default_id, record in records:
        row = to_schema(record, format, where, prompt_field, answer_field, hint)
        try:
            prompt = template.format(**{**record, **row})  # the source's own field names too
        except KeyError as exc:
            raise DataError(f"{where}: data.prompt_template names field {exc} that the row lacks") from None
        if not prompt.strip():
            raise DataError(f"{where}: the prompt is empty (field {prompt_field!r}); fill or drop the row")
        row_id = str(row[id_field]) if id_field and row.get(id_field) is not None else default_id
        rows.append(PromptRow(row_id, prompt, row["answer"], where, _messages(row.get("messages"), where)))
    if not rows:
        raise DataError(f"{label}: no prompts found")
    return rows


def _messages(messages: Any, where: str) -> tuple[dict[str, Any], ...] | None:
    """A row's ``messages`` checked: a list of ``{"role", "content"}`` objects with string content, or None."""
    if messages is None:
        return None
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise DataError(f"{where}: 'messages' must be a list of {{\"role\": ..., \"content\": ...}} objects with "
                        f"text content, got {str(messages)[:80]!r}")
    return tuple(messages)


def validate_golds(rows: Sequence[PromptRow], verifier) -> None:
    """Raise ValueError naming ``file:line`` of the first gold answer ``verifier`` cannot use.

    A gold the verifier cannot parse is the dataset's fault, found at data-loading time
    rather than as a silent reward of 0 for every response to that prompt.
    """
    from ggpo_verifiers import GoldAnswerError

    try:
        verifier.validate_golds([r.gold for r in rows])
    except GoldAnswerError as exc:
        row = rows[exc.index]
        raise DataError(f"{row.source}: {exc} (prompt id {row.id!r}); fix or drop the row") from exc
