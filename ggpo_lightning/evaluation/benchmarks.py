"""Benchmarks by name: the standard math test sets' layouts and the prompt template they are scored with, for
``ggpo eval --benchmark NAME --path FILE`` on a local copy (nothing is downloaded).

The template is the paper's setup (``recipes/qwen3-1.7b-math.yaml``'s ``data.prompt_template``): the problem, then
"Please reason step by step, and put your final answer within \\boxed{}."; the math verifier scores the last box.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggpo_lightning.evaluation.accuracy import load_benchmark
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.records.prompts import PAPER_TEMPLATE, PromptRow

__all__ = ["BENCHMARKS", "PAPER_TEMPLATE", "Benchmark", "load_named_benchmark"]



@dataclass(frozen=True)
class Benchmark:
    """A test set's layout as it is usually shared (JSONL/Parquet rows) and its display name."""

    title: str
    format: str
    """The layout (:data:`~ggpo_lightning.records.formats.FORMATS`)."""
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    """For the ``prompt-answer`` layout: the fields of the problem and of the gold."""
    template: str = PAPER_TEMPLATE


BENCHMARKS = {
    "math500": Benchmark("MATH-500", "math"),  # problem, solution, answer (HuggingFaceH4/MATH-500)
    "aime2024": Benchmark("AIME 2024", "math"),  # problem, solution, answer (HuggingFaceH4/aime_2024)
    "amc2023": Benchmark("AMC 2023", "prompt-answer", "question"),  # question, answer (math-ai/amc23)
    "minerva_math": Benchmark("Minerva Math", "prompt-answer", "question"),  # question, answer (math-ai/minervamath)
    # question, final_answer as a list of answers (OlympiadBench's OE_TO_maths_en_COMP; joined by ", ")
    "olympiadbench": Benchmark("OlympiadBench", "prompt-answer", "question", "final_answer"),
}
"""``--benchmark`` names -> layouts of the copies commonly shared on the Hugging Face hub (the source in the
comment); a copy with other field names is read with ``--format``/``--prompt-field``/``--answer-field`` as a file."""


def load_named_benchmark(name: str, path: str | Path, limit: int | None = None) -> tuple[Benchmark, list[PromptRow]]:
    """The benchmark ``name`` (:data:`BENCHMARKS`) read from the local file ``path`` in its layout.

    Raises:
        SettingsError: an unknown name (lists the known ones).
        DataError, FileNotFoundError: as :func:`~ggpo_lightning.evaluation.accuracy.load_benchmark`.
    """
    benchmark = BENCHMARKS.get(name)
    if benchmark is None:
        raise SettingsError(f"--benchmark {name!r} is not a known benchmark; known: {', '.join(BENCHMARKS)} "
                            "(or give the file as BENCH with --format)")
    fields = (benchmark.prompt_field, benchmark.answer_field) if benchmark.format == "prompt-answer" else (None, None)
    return benchmark, load_benchmark(path, *fields, limit=limit, format=benchmark.format)
