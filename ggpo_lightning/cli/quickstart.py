"""The quickstart's builders: the synthetic task's data and the tiny model warmed up on it, made where a recipe
says (``synthetic_data`` and ``tiny_model``, top-level recipe keys) before anything loads. The training glue knows
no task: to it these are a prompt file and a model folder like any other.

Two tasks: arithmetic (``synthetic_data.task: {max_operand, ops}``, the quickstart) and synth_math with worked
solutions (``synthetic_data.task: {families, levels}``, ``recipes/reasoning-cpu.yaml``); the keys a recipe sets
say which."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ggpo_lightning.records.errors import SettingsError, UserError
from ggpo_lightning.tasks.arithmetic import SPLITS_RECORD, ArithmeticTask
from ggpo_lightning.tasks.synth_math import SynthMathTask
from ggpo_lightning.tasks.tiny_model import TinyModelConfig, ensure_tiny_model

__all__ = ["SyntheticDataConfig", "build_quickstart_inputs", "tiny_model_config"]

TASKS = (ArithmeticTask, SynthMathTask)
"""The synthetic tasks, told apart by their fields (none set: arithmetic)."""


@dataclass
class SyntheticDataConfig:
    """The synthetic task, generated into the folder of ``data.train_path`` (``train.jsonl``, ``test.jsonl``,
    ``task.json``) when that file is missing."""

    task: ArithmeticTask | SynthMathTask
    """Problem family: arithmetic (``max_operand``, ``ops``; rows ``{"prompt", "answer"}``) or synth_math with worked
    solutions (``families``, ``levels``; rows ``{"problem", "answer", "solution", ...}``: ``data.prompt_field:
    problem``)."""
    n_train: int = 4096
    """Training prompts."""
    n_test: int = 512
    """Held-out prompts (the validation set)."""
    seed: int = 0
    """Seed of the problem generator."""


def build_quickstart_inputs(config: Any, train_path_from_command_line: bool = False) -> None:
    """What the parsed recipe ``config`` asks to be built: the synthetic data (``synthetic_data``) into
    ``data.train_path``'s folder when that file is missing, then the tiny model (``tiny_model``) at
    ``model.model_name_or_path`` when that folder is missing. Both groups' settings are checked first; data and a
    model built before are checked against the settings they were built with (a mismatch is a
    :class:`SettingsError`).

    Synthetic data is built only where the recipe itself says: a ``data.train_path`` given on the command line
    without ``synthetic_data`` settings there too (``train_path_from_command_line``) that does not exist is a
    :class:`SettingsError` naming the key, raised before anything is written (a typo in a path must not scatter
    generated data next to it)."""
    # every setting checked before anything is written or built
    with _recipe_group("synthetic_data"):
        synthetic = synthetic_data_config(config) if config.get("synthetic_data") is not None else None
    with _recipe_group("tiny_model"):
        tiny_model = tiny_model_config(config) if config.get("tiny_model") is not None else None
    if synthetic is not None:
        train_path = config["data"].get("train_path")
        if train_path is None:
            raise SettingsError("synthetic_data is generated into the folder of data.train_path; set "
                                "data.train_path (e.g. runs/quickstart/data/train.jsonl)")
        if not Path(train_path).is_file() and train_path_from_command_line:
            raise SettingsError(f"data.train_path {train_path} does not exist; synthetic_data is generated only at "
                                "the recipe's own data.train_path: give an existing file, or drop "
                                "--data.train_path to use the recipe's synthetic data (to generate it at this path, "
                                "set a --synthetic_data option too)")
        # splits written before are checked against their record: settings changed since are an error, not a
        # silent reuse of the old rows
        recorded = Path(train_path).name == "train.jsonl" and (Path(train_path).parent / SPLITS_RECORD).is_file()
        if not Path(train_path).is_file() or recorded:
            with _recipe_group("synthetic_data"):  # the counts are checked against the task here
                synthetic.task.write_splits(Path(train_path).parent, synthetic.n_train, synthetic.n_test,
                                            synthetic.seed)
    if tiny_model is not None:
        ensure_tiny_model(config["model"]["model_name_or_path"], tiny_model)


@contextlib.contextmanager
def _recipe_group(name: str) -> Iterator[None]:
    """The settings checks of recipe group ``name`` (a ``ValueError`` of the task or tiny-model configs) as a
    :class:`SettingsError` naming the group: one line, no traceback."""
    try:
        yield
    except UserError:
        raise
    except ValueError as error:
        raise SettingsError(f"{name}: {error}") from error


def synthetic_data_config(config: Any) -> SyntheticDataConfig:
    """The recipe's ``synthetic_data`` as a dataclass."""
    settings = _plain(config["synthetic_data"])
    return SyntheticDataConfig(**{**settings, "task": _task(_plain(settings["task"]))})


def _task(settings: dict[str, Any]) -> ArithmeticTask | SynthMathTask:
    """The task whose fields ``settings`` (the recipe's ``synthetic_data.task``) sets."""
    for kind in TASKS:
        if set(settings) <= {f.name for f in fields(kind)}:
            return kind(**settings)
    raise SettingsError(f"synthetic_data.task sets {', '.join(sorted(settings))}: give the fields of one task, "
                        "max_operand and ops (arithmetic) or families and levels (synth_math)")


def tiny_model_config(config: Any) -> TinyModelConfig:
    """The recipe's ``tiny_model``, warmed up on ``synthetic_data.task`` with the prompts of ``data.prompt_template``:
    a recipe states the task and the template once.

    ``tiny_model.task`` and ``tiny_model.prompt_template``, if set to anything but their defaults, must equal
    ``synthetic_data.task`` and ``data.prompt_template``.
    """
    settings = _plain(config["tiny_model"])
    if config.get("synthetic_data") is None:
        raise SettingsError("tiny_model needs synthetic_data: the tiny model's warm-up teaches the synthetic task; "
                            "set synthetic_data or drop tiny_model and give model.model_name_or_path a model folder")
    task = _plain(_plain(config["synthetic_data"])["task"])
    template = config["data"].get("prompt_template") or TinyModelConfig.prompt_template
    for key, source, value, default in (("task", "synthetic_data.task", task, asdict(ArithmeticTask())),
                                        ("prompt_template", "data.prompt_template", template,
                                         TinyModelConfig.prompt_template)):
        given = settings.pop(key, None)
        if given not in (None, default, value):
            raise SettingsError(f"tiny_model.{key} {given!r} differs from {source} {value!r}: the warm-up uses "
                                f"{source}; remove tiny_model.{key}")
    return TinyModelConfig(**settings, task=_task(task), prompt_template=template)


def _plain(value: Any) -> dict[str, Any]:
    """A parsed dataclass value (a jsonargparse Namespace, the dataclass itself, or a dict) as a plain dict."""
    if isinstance(value, dict):
        return value
    return value.as_dict() if hasattr(value, "as_dict") else asdict(value)
