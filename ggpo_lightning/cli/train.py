"""The ``ggpo-train`` LightningCLI: recipe in, trained model and ``summary.json`` out."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentError, DefaultHelpFormatter

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import ModelParallelStrategy

from ggpo_lightning import __version__
from ggpo_lightning.core.distributed import launched_as_global_rank_zero
from ggpo_lightning.core.objectives import import_objective_modules
from ggpo_lightning.records.errors import FolderInUseError, MissingFileError, SettingsError
from ggpo_lightning.records.atomic import remove_orphans
from ggpo_lightning.training.callbacks import RunGuard, RunInterrupted, RunSummary
from ggpo_lightning.training.checkpoint_io import AtomicCheckpointIO, AtomicModelParallelStrategy
from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.records.errors import RunAborted
from ggpo_lightning.training.module import GGPOModule
from ggpo_lightning.training.preflight import check_run
from ggpo_lightning.training.settings import check_model_settings
from ggpo_lightning.training.samples import SampleLog
from ggpo_lightning.cli.errors import debug_requested, report_user_errors
from ggpo_lightning.cli.parse_errors import explain_parse_error, known_keys
from ggpo_lightning.cli.recipe_keys import check_renamed_keys
from ggpo_lightning.records.run_lock import RunLock, lock_run_directory, release_lock, release_run_directory
from ggpo_lightning.cli.quickstart import SyntheticDataConfig, build_quickstart_inputs
from ggpo_lightning.tasks.tiny_model import TinyModelConfig

__all__ = ["GGPOTrainCLI", "check_config_files", "check_devices", "exit_code", "launched_as_global_rank_zero", "lock_logger_directory",
           "next_version_dir", "run_training", "train_main"]

USAGE = "ggpo-train --config RECIPE.yaml [--config OVERLAY.yaml ...] [--KEY VALUE ...]"
"""The first line of ``ggpo-train --help`` (argparse's own would list all of its hundreds of keys)."""

DESCRIPTION = """\
Trains a language model with GGPO (or GRPO, AGRO, MaxRL) on verifiable rewards: a recipe in, a trained model and
summary.json out. A recipe is a YAML file; every key below can be set in it or as --KEY VALUE after it.

  ggpo-train --config recipes/quickstart.yaml            the CPU quickstart (a few minutes, nothing downloaded)
  ggpo recipes list                                      the shipped recipes (ggpo recipes copy NAME: one to edit)
  ggpo-train --config RECIPE.yaml --print_config         the recipe with every key resolved
  ggpo-train --config RECIPE.yaml --ckpt_path CKPT       resume a run

The documentation site (docs/; make docs) lists every key in its configuration reference; docs/recipes.md and
recipes/README.md explain the recipes; Lightning's own keys (trainer.*) follow its Trainer."""
"""What ``ggpo-train --help`` says before the keys."""


class _HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, with the description's own line breaks kept (argparse's RawDescriptionHelpFormatter)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


TRAINER_DEFAULTS = {
    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    "check_val_every_n_epoch": None,  # one endless epoch: validate every val_check_interval steps
    "val_check_interval": 100,
    "max_steps": 100,
}


class GGPOTrainCLI(LightningCLI):
    """LightningCLI with the run's summary, step-based checkpoints and :class:`~ggpo_lightning.training.callbacks.RunGuard`
    always attached, atomic checkpoint files (:class:`~ggpo_lightning.training.checkpoint_io.AtomicCheckpointIO`), the
    recipe and data checked before any weights load (:mod:`~ggpo_lightning.training.preflight`) and the run directory
    locked (:mod:`~ggpo_lightning.records.run_lock`)."""

    run_lock: RunLock | None = None
    """The lock of the run directory (held until the run ends)."""
    train_path_from_command_line = False
    """Whether ``--data.train_path`` was given on the command line without ``--synthetic_data`` settings (synthetic
    data is then built only at the recipe's own path)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--version", action="version", version=f"ggpo-train {__version__}")
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(SampleLog, "samples")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.every_n_train_steps": 100, "checkpoint.save_last": True})
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="Resume from this checkpoint.")
        parser.add_argument("--resume_mismatch_ok", type=bool, default=False,
                            help="Resume a checkpoint whose settings (objective, beta, k, sync_every, rollout "
                                 "schedule, prompts_per_step, model) or training data differ from this run's, with a "
                                 "warning instead of an error.")
        parser.add_argument("--memory_check", type=bool, default=True,
                            help="Refuse to start when the memory estimate printed at start (weights, gradients, "
                                 "optimizer state, reference, activations per micro-batch, rollout engine) exceeds "
                                 "the GPU's memory, or on CPU the available host memory; false starts anyway.")
        parser.add_argument("--objective_module", type=str | list[str] | None, default=None,
                            help="Import this module (or each of a list: [a.b, c]) before the recipe is checked: "
                                 "objectives it registers (register_objective) can be named by "
                                 "model.objective.name. Objectives of installed packages need none: they are found "
                                 "through the entry-point group ggpo.objectives (docs/ADDING_AN_OBJECTIVE.md).")
        parser.add_argument("--tiny_model", type=TinyModelConfig | None, default=None,
                            help="Build a tiny local model (tokenizer, Llama config, supervised warm-up on "
                                 "synthetic_data.task through data.prompt_template) at model.model_name_or_path "
                                 "when that folder does not exist: CPU runs and tests without downloads.")
        parser.add_argument("--synthetic_data", type=SyntheticDataConfig | None, default=None,
                            help="Generate the synthetic task (arithmetic, or synth_math with worked solutions) into "
                                 "the folder of data.train_path when that file does not exist (the quickstart's and "
                                 "the reasoning recipe's data).")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse as LightningCLI does; a mistake is one :class:`SettingsError` line (an unknown key with the closest
        valid one, a bad value with its key), and ``--print_config`` prints only a recipe whose values the run
        would accept."""
        given = [str(a) for a in (sys.argv[1:] if args is None else args)] if not isinstance(args, dict) else []
        try:
            if any(a.startswith("--print_config") for a in given):  # jsonargparse prints and exits in the parse
                config = parser.parse_args([a for a in given if not a.startswith("--print_config")]).as_dict()
                import_objective_modules(_as_list(config.get("objective_module")))
                PromptGroupDataModule(**config["data"])  # its constructor checks data.* and reads no file
                check_model_settings(config["model"])
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            raise SettingsError(explain_parse_error(str(err), known_keys(parser), _config_files(given))) from None
        import_objective_modules(_as_list(self.config.get("objective_module")))  # before model.objective is checked
        # a command line that sets synthetic_data itself asks for it at its own data.train_path
        self.train_path_from_command_line = _on_command_line(given, "data.train_path") and not _on_command_line(
            given, "synthetic_data")

    def before_instantiate_classes(self) -> None:
        check_devices(self.config["trainer"]["accelerator"], self.config["trainer"]["devices"])
        # before the data and model.model_name_or_path are read
        build_quickstart_inputs(self.config, self.train_path_from_command_line)
        check_run(self.config.as_dict(), self.config.get("ckpt_path"))
        if launched_as_global_rank_zero():
            self.run_lock = lock_logger_directory(self.config)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except BaseException:
            if self.run_lock is not None:  # nothing was written: leave no empty run directory behind
                release_run_directory(self.run_lock)
            raise

    def instantiate_trainer(self, **kwargs: Any):
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.append(RunGuard())
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # a user's plugin stays
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if type(trainer.strategy) is ModelParallelStrategy:  # the subclass adds no state: only its save differs
            trainer.strategy.__class__ = AtomicModelParallelStrategy
        return trainer


def check_config_files(paths: list[str]) -> None:
    """A ``--config`` file that does not exist: one line naming it, and for the name of a shipped recipe
    (``--config quickstart``) the command that writes it here."""
    from ggpo_lightning.cli.recipes import recipe_files

    for path in paths:
        if path.lstrip().startswith("{") or Path(path).expanduser().exists():  # "{...}": a recipe given inline
            continue
        name = path.removesuffix(".yaml").removeprefix("recipes/")
        hint = (f"; {name!r} is a shipped recipe: `ggpo recipes copy {name}` writes it to "
                f"{Path(recipe_files()[name].name)} here, to pass to --config (`ggpo recipes list` shows them all)"
                if name in recipe_files() else "")
        raise MissingFileError(f"--config {path}: no such file{hint}")


def _as_list(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def _config_files(args: list[str]) -> list[str]:
    """The recipe files of ``--config PATH``, ``--config=PATH`` and ``-c PATH`` among ``args`` (a saved run
    configuration migrated by :func:`~ggpo_lightning.cli.recipe_keys.check_renamed_keys` arrives as YAML text:
    left out)."""
    files = []
    for i, arg in enumerate(args):
        flag, equals, inline = arg.partition("=")
        value = inline if equals else (args[i + 1] if i + 1 < len(args) else "")
        if flag in ("--config", "-c") and "\n" not in value:
            files.append(value)
    return files


def _on_command_line(args: list[str], key: str) -> bool:
    """Whether ``args`` set ``key`` or a key under it (``--key V``, ``--key=V``, ``--key.sub V``)."""
    return any(a == f"--{key}" or a.startswith((f"--{key}=", f"--{key}.")) for a in args)


def lock_logger_directory(config: Any) -> RunLock | None:
    """Choose the run directory of the recipe ``config``'s logger, lock it
    (:func:`~ggpo_lightning.records.run_lock.lock_run_directory`) and pin the logger to it, so that every run writes
    into a folder of its own and leaves earlier runs untouched.

    - A ``save_dir/name/version`` logger (CSV, TensorBoard): its next ``version_N`` (or the ``version`` given, which
      must not hold an earlier run), pinned as its ``version``.
    - A logger with a ``save_dir`` but no run folder of its own (W&B, whose ``version`` is its run id): the next
      ``save_dir/NAME/version_N`` (``NAME``: the logger's ``name``, else its own name, W&B's project, else ``wandb``)
      becomes its ``save_dir`` (W&B keeps its files under ``wandb/`` there) and ``checkpoint.dirpath`` its
      ``checkpoints/``, unless set.

    None (no lock) when the logger is off or takes neither. Also removes what killed earlier runs left
    half-written in the sibling run directories and their ``checkpoints/``
    (:func:`~ggpo_lightning.records.atomic.remove_orphans`)."""
    from lightning.pytorch.cli import instantiate_class

    logger = config["trainer"].get("logger")
    init_args = (logger.get("init_args") or {}) if hasattr(logger, "get") else {}
    if "version" not in init_args:
        return None
    instance = instantiate_class((), logger.as_dict())
    named = None
    if getattr(instance, "log_dir", None) is not None:
        run_dir = Path(instance.log_dir)
        named = init_args["version"] is not None  # a folder named in the recipe: never another run's
        init_args["version"] = instance.version
    elif init_args.get("save_dir") is not None:
        name = init_args.get("name") or instance.name or type(instance).__name__.removesuffix("Logger").lower()
        run_dir = next_version_dir(Path(init_args["save_dir"]) / str(name))
        init_args["save_dir"] = str(run_dir)
        if config["checkpoint"].get("dirpath") is None:
            config["checkpoint"]["dirpath"] = str(run_dir / "checkpoints")
    else:
        return None
    # the lock first: a live run writing there is named by its pid, whatever the folder already holds
    handle = lock_run_directory(run_dir)
    if named:
        try:
            _refuse_earlier_run(run_dir)
        except FolderInUseError:
            release_lock(handle)  # the earlier run's files stay as they are
            raise
    for directory in (*run_dir.parent.glob("*/"), *run_dir.parent.glob("*/checkpoints/")):
        remove_orphans(directory)  # temporary files of earlier runs killed mid-save (their own folders)
    return handle


RUN_FILES = ("config.yaml", "metrics.csv", "summary.json", "checkpoints", "final_model")
"""What a run writes into its directory: a folder holding one of them holds an earlier run."""


def _refuse_earlier_run(run_dir: Path) -> None:
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    if found:
        raise FolderInUseError(f"run directory {run_dir} holds an earlier run ({', '.join(found)}); leave out "
                               "trainer.logger.init_args.version for the next free version_N, or give another one")


def next_version_dir(parent: Path) -> Path:
    """``parent/version_N`` for the first ``N`` above every ``version_*`` folder there (``version_0`` in a new or
    empty ``parent``), as the CSV and TensorBoard loggers number their runs."""
    numbers = [int(p.name[len("version_"):]) for p in parent.glob("version_*")
               if p.is_dir() and p.name[len("version_"):].isdigit()]
    return parent / f"version_{max(numbers, default=-1) + 1}"


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
    raise SettingsError(f"trainer.devices asks for {requested} {kind}, but this machine has {available}; {fix} "
                        "or run on a machine with more")


def _recipe_name(config_paths: list) -> str | None:
    """``quickstart`` for one config; ``qwen3-1.7b-math+grpo`` for a base recipe plus an overlay."""
    # a saved configuration migrated by check_renamed_keys arrives as YAML text, not a path: no name
    return "+".join(Path(str(p)).stem for p in config_paths if "\n" not in str(p)) or None


# Lightning warnings that describe this trainer's design, not a user's mistake: the
# frozen reference is in eval mode on purpose; the dataloader_iter step is what keeps
# rollouts from being prefetched ahead of the weight sync; a sharded ``last.ckpt`` folder is
# rewritten on purpose at every save.
_EXPECTED_WARNINGS = (r".*module\(s\) in eval mode.*", r".*dataloader_iter.*", r".*Detected an existing checkpoint.*")


def run_training(args: list[str] | None = None) -> GGPOTrainCLI:
    """Parse a recipe (and overrides), train, and return the CLI (its ``trainer``, ``model``, ...)."""
    for pattern in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    given = sys.argv[1:] if args is None else args
    check_config_files(_config_files(given))
    checked = check_renamed_keys(given)
    # the command line is LightningCLI's own unless a saved configuration was migrated (handing it the same list
    # again makes it warn that args and a command line were both given: ggpo-train's own call)
    args = None if checked == sys.argv[1:] else checked
    cli = GGPOTrainCLI(
        GGPOModule,
        PromptGroupDataModule,
        run=False,
        auto_configure_optimizers=False,  # the module's optimizer covers the learner only
        save_config_kwargs={"overwrite": True},
        trainer_defaults=TRAINER_DEFAULTS,
        # parse_arguments turns the error into one line; a shortened key (--trainer.max_step) is refused, not guessed
        parser_kwargs={"exit_on_error": False, "allow_abbrev": False, "usage": USAGE, "description": DESCRIPTION,
                       "formatter_class": _HelpFormatter},
        args=args,
    )
    summary = next(cb for cb in cli.trainer.callbacks if isinstance(cb, RunSummary))
    summary.recipe = summary.recipe or _recipe_name(cli.config.get("config") or [])
    cli.model.resume_mismatch_ok = cli.config.get("resume_mismatch_ok", False)
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.get("ckpt_path"))
    except BaseException:  # a run stopped before its first step (a refused resume) leaves no run directory behind
        if cli.run_lock is not None:
            release_run_directory(cli.run_lock)
        raise
    if cli.run_lock is not None:  # written all it writes: a later run in this process may take the lock again
        cli.run_lock.lock.release()  # its file stays, as when the process exits
        cli.run_lock = None
    return cli


def exit_code(error: RunAborted) -> int:
    """``ggpo-train``'s exit status for a run stopped early: 128 + the signal number for a signal (as a shell
    reports it), else 1."""
    return 128 + error.signum if isinstance(error, RunInterrupted) else 1


def train_main(args: list[str] | None = None) -> None:
    """``ggpo-train --config recipes/NAME.yaml [--model.objective.beta 0.05 ...]``: one training run.

    A LightningCLI over :class:`~ggpo_lightning.training.module.GGPOModule` and
    :class:`~ggpo_lightning.training.data.PromptGroupDataModule`; ``--print_config`` prints the
    resolved recipe, ``--ckpt_path`` resumes a run. A user error (a setting, the data, the checkpoint, the
    resume; :mod:`~ggpo_lightning.cli.errors`) prints one line and exits 2; ``--debug`` or ``GGPO_DEBUG=1``
    shows its traceback. The console script and ``python -m ggpo_lightning.cli.train`` (torchrun's form) both run
    this, so both exit with the same codes.
    """
    debug, args = debug_requested(sys.argv[1:] if args is None else args)
    try:
        report_user_errors("ggpo-train", lambda: run_training(args), debug)
    except RunAborted as stop:  # the checkpoint and summary.json are saved (RunGuard); no traceback
        print(f"ggpo-train: {stop.status}: {stop}", file=sys.stderr, flush=True)
        sys.exit(exit_code(stop))


if __name__ == "__main__":
    train_main()
