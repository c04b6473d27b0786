"""The quickstart's builders: the synthetic task's data and the tiny model warmed up on it, made where a recipe
says (``synthetic_data`` and ``tiny_model``, top-level recipe keys) before anything loads. The training glue knows
no task: to it these are a prompt file and a model folder like any other."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits
from ggpo_lightning.tasks.tiny_model import TinyModelConfig, ensure_tiny_model

__all__ = ["SyntheticDataConfig", "build_quickstart_inputs", "tiny_model_config"]


@dataclass
class SyntheticDataConfig:
    """The synthetic arithmetic task, generated into the folder of ``data.train_path`` (``train.jsonl``,
    ``test.jsonl``, ``task.json``) when that file is missing."""

    task: ArithmeticTask
    """Problem family (operand range, operators)."""
    n_train: int = 4096
    """Training prompts."""
    n_test: int = 512
    """Held-out prompts (the validation set)."""
    seed: int = 0
    """Seed of the problem generator."""


def build_quickstart_inputs(config: Any, train_path_from_command_line: bool = False) -> None:
    """What the parsed recipe ``config`` asks to be built: the synthetic data (``synthetic_data``) into
    ``data.train_path``'s folder when that file is missing, then the tiny model (``tiny_model``) at
    ``model.model_name_or_path`` when that folder is missing.

    Synthetic data is built only where the recipe itself says: a ``data.train_path`` given on the command line
    without ``synthetic_data`` settings there too (``train_path_from_command_line``) that does not exist is a
    :class:`SettingsError` naming the key, raised before anything is written (a typo in a path must not scatter
    generated data next to it)."""
    synthetic = config.get("synthetic_data")
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
        if not Path(train_path).is_file():
            settings = synthetic_data_config(config)
            write_splits(settings.task, Path(train_path).parent, settings.n_train, settings.n_test, settings.seed)
    if config.get("tiny_model") is not None:
        ensure_tiny_model(config["model"]["model_name_or_path"], tiny_model_config(config))


def synthetic_data_config(config: Any) -> SyntheticDataConfig:
    """The recipe's ``synthetic_data`` as a dataclass."""
    settings = _plain(config["synthetic_data"])
    return SyntheticDataConfig(**{**settings, "task": ArithmeticTask(**_plain(settings["task"]))})


def tiny_model_config(config: Any) -> TinyModelConfig:
    """The recipe's ``tiny_model``, warmed up on ``synthetic_data.task``: a recipe states the task once.

    ``tiny_model.task``, if set to anything but the default, must equal ``synthetic_data.task``.
    """
    settings = _plain(config["tiny_model"])
    if config.get("synthetic_data") is None:
        raise SettingsError("tiny_model needs synthetic_data: the tiny model's warm-up teaches the synthetic task; "
                            "set synthetic_data or drop tiny_model and give model.model_name_or_path a model folder")
    task = _plain(_plain(config["synthetic_data"])["task"])
    given = settings.pop("task", None)
    if given not in (None, asdict(ArithmeticTask()), task):
        raise SettingsError(f"tiny_model.task {given} differs from synthetic_data.task {task}: the warm-up uses "
                            "synthetic_data.task; remove tiny_model.task")
    return TinyModelConfig(**settings, task=ArithmeticTask(**task))


def _plain(value: Any) -> dict[str, Any]:
    """A parsed dataclass value (a jsonargparse Namespace, the dataclass itself, or a dict) as a plain dict."""
    if isinstance(value, dict):
        return value
    return value.as_dict() if hasattr(value, "as_dict") else asdict(value)
