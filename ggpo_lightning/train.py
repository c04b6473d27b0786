"""The ``ggpo-train`` LightningCLI: recipe in, trained model and ``summary.json`` out."""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from ggpo_lightning.callbacks import RunSummary
from ggpo_lightning.data import PromptGroupDataModule
from ggpo_lightning.module import GGPOModule
from ggpo_lightning.recipe_keys import check_renamed_keys
from ggpo_lightning.tasks.arithmetic import ArithmeticTask
from ggpo_lightning.tasks.tiny_model import TinyModelConfig, ensure_tiny_model

__all__ = ["GGPOTrainCLI", "check_devices", "run_training"]

TRAINER_DEFAULTS = {
    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    "check_val_every_n_epoch": None,  # one endless epoch: validate every val_check_interval steps
    "val_check_interval": 100,
    "max_steps": 100,
}


class GGPOTrainCLI(LightningCLI):
    """LightningCLI with the run's summary and step-based checkpoints always attached."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.every_n_train_steps": 100, "checkpoint.save_last": True})
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="Resume from this checkpoint.")
        parser.add_argument("--tiny_model", type=TinyModelConfig | None, default=None,
                            help="Build a tiny local model (tokenizer, Llama config, supervised warm-up on "
                                 "data.synthetic.task) at model.model_name_or_path when that folder does not exist: "
                                 "CPU runs and tests without downloads.")

    def before_instantiate_classes(self) -> None:
        check_devices(self.config["trainer"]["accelerator"], self.config["trainer"]["devices"])
        if self.config.get("tiny_model") is not None:  # before the module loads model.model_name_or_path
            ensure_tiny_model(self.config["model"]["model_name_or_path"], tiny_model_config(self.config))


def check_devices(accelerator: Any, devices: Any) -> None:
    """A recipe asking for more GPUs (or CPU processes) than this machine has fails here, naming the setting.

    Lightning would fail later, inside the processes it starts, or oversubscribe the CPU.
    """
    try:
        requested = int(devices)
    except (TypeError, ValueError):
        return  # "auto", a list of device ids: Lightning resolves and checks those
    name = str(accelerator).lower()
    if name in ("gpu", "cuda") or (name == "auto" and torch.cuda.is_available()):
        available, kind = torch.cuda.device_count(), "GPU(s)"
    elif name == "cpu":
        available, kind = os.cpu_count() or 1, "CPU cores (one process each)"
    else:
        return
    if requested <= available:
        return
    fix = (f"set --trainer.devices {available} (data.prompts_per_step stays the whole step's prompts)" if available
           else "set --trainer.accelerator cpu")
    raise ValueError(f"trainer.devices asks for {requested} {kind}, but this machine has {available}; {fix} "
                     "or run on a machine with more")


def tiny_model_config(config: Any) -> TinyModelConfig:
    """The recipe's ``tiny_model``, warmed up on ``data.synthetic.task``: a recipe states the task once.

    ``tiny_model.task``, if set to anything but the default, must equal ``data.synthetic.task``.
    """
    settings = _plain(config["tiny_model"])
    synthetic = config["data"].get("synthetic")
    if synthetic is None:
        raise ValueError("tiny_model needs data.synthetic: the tiny model's warm-up teaches the synthetic task; "
                         "set data.synthetic or drop tiny_model and give model.model_name_or_path a model folder")
    task = _plain(synthetic)["task"]
    given = settings.pop("task", None)
    if given not in (None, asdict(ArithmeticTask()), task):
        raise ValueError(f"tiny_model.task {given} differs from data.synthetic.task {task}: the warm-up uses "
                         "data.synthetic.task; remove tiny_model.task")
    return TinyModelConfig(**settings, task=ArithmeticTask(**task))


def _plain(value: Any) -> dict[str, Any]:
    """A parsed dataclass value (a jsonargparse Namespace, or the dataclass itself) as a plain dict."""
    return value.as_dict() if hasattr(value, "as_dict") else asdict(value)


def _recipe_name(config_paths: list) -> str | None:
    """``quickstart`` for one config; ``qwen3-1.7b-math+grpo`` for a base recipe plus an overlay."""
    return "+".join(Path(str(p)).stem for p in config_paths) or None


# Lightning warnings that describe this trainer's design, not a user's mistake: the
# frozen reference is in eval mode on purpose; the dataloader_iter step is what keeps
# rollouts from being prefetched ahead of the weight sync; a sharded ``last.ckpt`` folder is
# rewritten on purpose at every save.
_EXPECTED_WARNINGS = (r".*module\(s\) in eval mode.*", r".*dataloader_iter.*", r".*Detected an existing checkpoint.*")


def run_training(args: list[str] | None = None) -> GGPOTrainCLI:
    """Parse a recipe (and overrides), train, and return the CLI (its ``trainer``, ``model``, ...)."""
    for pattern in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    check_renamed_keys(sys.argv[1:] if args is None else args)
    cli = GGPOTrainCLI(
        GGPOModule,
        PromptGroupDataModule,
        run=False,
        auto_configure_optimizers=False,  # the module's optimizer covers the learner only
        save_config_kwargs={"overwrite": True},
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
    )
    summary = next(cb for cb in cli.trainer.callbacks if isinstance(cb, RunSummary))
    summary.recipe = summary.recipe or _recipe_name(cli.config.get("config") or [])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.get("ckpt_path"))
    return cli


if __name__ == "__main__":
    run_training()
