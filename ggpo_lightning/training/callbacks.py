"""Callbacks of a training run: the reference refresh schedule (and the every-N-updates base of the rollout sync's,
:class:`~ggpo_lightning.training.rollout_loop.RolloutLoop`), the step progress bar, held-out
accuracy before/after with the export and ``summary.json`` (:class:`RunSummary`), and what a stopped run saves
(:class:`RunGuard`)."""

from __future__ import annotations

import abc
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint, RichProgressBar

from ggpo_lightning.records.atomic import atomic_write_text
from ggpo_lightning.records.errors import DiskFullError
from ggpo_lightning.core.distributed import sum_across_ranks, world
from ggpo_lightning.models.export import write_folder
from ggpo_lightning.records.errors import RunAborted

__all__ = ["EveryNUpdates", "ReferenceRefresh", "RunGuard", "RunInterrupted", "RunSummary", "StepProgressBar"]

log = logging.getLogger(__name__)


class EveryNUpdates(L.Callback, abc.ABC):
    """Runs :meth:`act` after every ``every``-th optimizer update (once per update)."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"{type(self).__name__}: every must be >= 1, got {every}")
        self.every = every
        self.last_step = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step  # with gradient accumulation several batches end at one step: act once
        if step > self.last_step and step % self.every == 0:
            self.act(pl_module)
            self.last_step = step

    @abc.abstractmethod
    def act(self, pl_module: L.LightningModule) -> None:
        """What the schedule does to the module."""

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_step = state_dict["last_step"]


class ReferenceRefresh(EveryNUpdates):
    """Copies the learner into the frozen reference every M optimizer updates (the paper: 160)."""

    def act(self, pl_module: L.LightningModule) -> None:
        pl_module.refresh_reference()


class StepProgressBar(RichProgressBar):
    """Rich progress bar of a step-based run: ``step`` with optimizer steps of ``max_steps`` (``ggpo-train`` runs
    one endless epoch, where Lightning's bar would read "Epoch 0/-2"), and the few metrics a user watches:
    ``reward``, ``staleness``, ``loss``, the mean response length ``len``, the truncated share ``trunc`` and the
    latest held-out ``val_acc``."""

    SHOWN = {"train/reward": "reward", "train/staleness": "staleness", "train/loss": "loss",
             "train/response_length": "len", "train/truncated_share": "trunc", "val/accuracy": "val_acc"}

    @property
    def total_train_batches(self) -> int | float:
        max_steps = self.trainer.max_steps
        return max_steps if max_steps and max_steps > 0 else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'step':{len(self.validation_description)}}"

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._update(self.train_progress_bar_id, trainer.global_step)  # resumed runs start mid-way

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = trainer.progress_bar_metrics
        return {short: metrics[name] for name, short in self.SHOWN.items() if name in metrics}


class RunSummary(L.Callback):
    """Measures held-out accuracy before and after training, exports the final model, writes ``summary.json``.

    Accuracy is the module's ``evaluate`` (greedy pass@1 with the run's verifier) on the
    datamodule's validation prompts. The final learner is saved with ``save_pretrained``
    (plus its tokenizer) in ``<run dir>/final_model``, loadable by transformers and
    inference engines; a LoRA run saves its adapter in ``final_adapter/`` and the merged
    model in ``final_model/`` on request (:func:`~ggpo_lightning.models.export.export_targets`). ``summary.json`` in the
    run directory holds ``accuracy_before``, ``accuracy_after`` (fractions),
    ``optimizer_steps``, ``generated_samples``, ``wall_seconds``, ``recipe``, the export
    folders (``final_model``, with LoRA ``final_adapter``; null when not written) and
    ``status``: ``completed``; a run stopped by a signal or an error says ``interrupted``
    or ``aborted`` with its ``reason`` and ``checkpoint`` (:class:`RunGuard`).

    Args:
        export: save the final model.
        recipe: the recipe's name for the summary (``ggpo-train`` fills it from ``--config``).
    """

    def __init__(self, export: bool = True, recipe: str | None = None) -> None:
        self.export = export
        self.recipe = recipe
        self.accuracy_before: float | None = None
        self._wall_before = 0.0  # seconds spent in earlier sessions of a resumed run
        self._start = 0.0

    @staticmethod
    def run_dir(trainer: L.Trainer) -> Path:
        return Path(trainer.log_dir or trainer.default_root_dir)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        rows = trainer.datamodule.val_rows
        if self.accuracy_before is None and rows:  # every rank: evaluation is split across ranks
            self.accuracy_before = pl_module.evaluate(rows)
            if trainer.is_global_zero:
                print(f"held-out accuracy of the starting model: {self.accuracy_before:.3f} ({len(rows)} prompts)",
                      flush=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Evaluation, the sharded export's gather and the sample count are collectives: every rank
        # takes part; rank 0 alone writes.
        rows = trainer.datamodule.val_rows
        accuracy_after = pl_module.evaluate(rows) if rows else None
        run_dir = self.run_dir(trainer)
        exported = pl_module.exports(run_dir) if self.export else {}
        generated = self._generated(pl_module)
        if not trainer.is_global_zero:
            return
        for target, write in exported.items():
            write_folder(target, write)
        exported_names = {target.name: str(target) for target in exported}
        summary = {**self._common(trainer, pl_module, "completed", generated), "accuracy_after": accuracy_after,
                   "final_model": exported_names.get("final_model")}
        if pl_module.policy.lora is not None:
            summary["final_adapter"] = exported_names.get("final_adapter")
        self._write(run_dir, summary)
        self._print_table(summary)

    def write_stopped(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str, reason: str,
                      checkpoint: Path | None) -> None:
        """``summary.json`` of a run that did not finish: ``status`` (``interrupted`` or ``aborted``), ``reason``
        and the ``checkpoint`` to resume from; no final evaluation or export. Every rank calls it (the sample
        count is summed); rank 0 writes."""
        generated = self._generated(pl_module)
        run_dir = self.run_dir(trainer)  # on every rank: trainer.log_dir is a collective (a broadcast from rank 0)
        if not trainer.is_global_zero:
            return
        summary = {**self._common(trainer, pl_module, status, generated), "reason": reason,
                   "checkpoint": None if checkpoint is None else str(checkpoint)}
        self._write(run_dir, summary)

    def _common(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str, generated: int) -> dict:
        return {
            "status": status,
            "recipe": self.recipe,
            "objective": pl_module.objective.name,
            "behavior_anchor": pl_module.anchor_weight,  # the resolved lambda: tells ggpo-paper (0) from shipped ggpo
            "accuracy_before": self.accuracy_before,
            "optimizer_steps": trainer.global_step,
            "generated_samples": generated,
            "skipped_nan_steps": pl_module.nan_guard.total,
            "wall_seconds": round(self._wall_before + time.perf_counter() - self._start, 2),
            "val_prompts": len(trainer.datamodule.val_rows),
        }

    @staticmethod
    def _generated(pl_module: L.LightningModule) -> int:
        return int(sum_across_ranks(torch.tensor([pl_module.generated_samples], dtype=torch.float64,
                                                 device=pl_module.device)).item())

    @staticmethod
    def _write(run_dir: Path, summary: dict[str, Any]) -> None:
        path = run_dir / "summary.json"
        atomic_write_text(path, json.dumps(summary, indent=2) + "\n")
        print(f"summary written to {path}", flush=True)

    @staticmethod
    def _print_table(s: dict[str, Any]) -> None:
        def pct(v: float | None) -> str:
            return "   n/a" if v is None else f"{100 * v:5.1f}%"

        gain = (None if s["accuracy_before"] is None or s["accuracy_after"] is None
                else s["accuracy_after"] - s["accuracy_before"])
        print("\n  held-out accuracy   before    after   change", flush=True)
        print(f"  {s['objective']:<18} {pct(s['accuracy_before'])}   {pct(s['accuracy_after'])}   "
              f"{'   n/a' if gain is None else f'{100 * gain:+5.1f}'}", flush=True)
        print(f"  {s['optimizer_steps']} optimizer steps, {s['generated_samples']} generated samples, "
              f"{s['wall_seconds']:.0f} s\n", flush=True)

    def state_dict(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self._start if self._start else 0.0
        return {"accuracy_before": self.accuracy_before, "wall_seconds": self._wall_before + elapsed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.accuracy_before = state_dict["accuracy_before"]
        self._wall_before = state_dict["wall_seconds"]


class RunInterrupted(RunAborted):
    """SIGINT or SIGTERM stopped the run after a step (:class:`RunGuard`)."""

    status = "interrupted"

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class RunGuard(Checkpoint):
    """Nothing lost when a run stops early: a checkpoint and a ``summary.json`` that says why.

    - SIGINT (Ctrl-C) or SIGTERM: the step in progress finishes, then ``interrupted.ckpt``
      is saved in the checkpoint folder (the state an uninterrupted run had after that
      step: resuming from it continues draw for draw) and :class:`RunInterrupted` ends
      the run (``ggpo-train`` exits 128 + the signal number). A second signal stops at once
      (Lightning's KeyboardInterrupt handling; the checkpoint is then taken mid-step). A SIGTERM
      that Lightning's own handler noted before training started stops the run after its first step.
    - :class:`~ggpo_lightning.records.errors.RunAborted` (e.g. a failing verifier): ``aborted.ckpt``,
      on every process.
    - Any other exception on one process: ``aborted.ckpt`` with the state at the failure
      (resumable, not draw for draw). On several processes only the deliberate stops
      save: the other ranks may not reach the collective save.
    - :class:`~ggpo_lightning.records.errors.DiskFullError` (a save found the disk full): no
      ``aborted.ckpt`` (it would meet the same full disk); the summary is tried (a few
      hundred bytes may still fit) and the message names the previous checkpoint to resume from.

    ``summary.json`` gets ``status`` (``interrupted``/``aborted``), ``reason`` and
    ``checkpoint`` (:meth:`RunSummary.write_stopped`). No checkpoint before training starts:
    a deliberate stop there (the starting model's evaluation found a broken verifier) writes
    the summary only; any other error there (configuration, resume) writes nothing.

    A :class:`Checkpoint` subclass, so Lightning runs it after the module's schedules (the
    saved engine and reference are the step's).
    """

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal received, until the step ends
        self._previous: dict[int, Any] = {}
        self._training = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = True
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)
        if trainer.received_sigterm:  # noted by Lightning's handler, installed before ours: this guard acts on it
            trainer._signal_connector.received_sigterm = False  # else Lightning stops at the epoch's end, exit 0
            self._on_signal(signal.SIGTERM, None)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt  # the second signal: stop now
        self.requested = signum
        name = signal.Signals(signum).name
        print(f"\n{name} received: saving a checkpoint after this step, then stopping ({name} again: stop now)",
              file=sys.stderr, flush=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        signum = float(self.requested or 0)
        if world()[1] > 1:  # a signal that reached one rank stops all of them at this step
            signum = float(sum_across_ranks(torch.tensor([signum], device=pl_module.device)).item())
        if signum:
            raise RunInterrupted(self.requested or signal.SIGTERM)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()
        deliberate = isinstance(exception, RunAborted)
        if not (self._training or deliberate) or (not deliberate and world()[1] > 1):
            return
        status = exception.status if deliberate else (
            "interrupted" if isinstance(exception, (KeyboardInterrupt, SystemExit)) else "aborted")
        directory = Path(getattr(trainer.checkpoint_callback, "dirpath", None)
                         or RunSummary.run_dir(trainer) / "checkpoints")
        path = None
        if isinstance(exception, DiskFullError):  # saving again would meet the same full disk
            previous = directory / "last.ckpt"
            path = previous if previous.exists() else None
        elif self._training:  # before the first step there is nothing to save
            path = directory / f"{status}.ckpt"
            trainer.save_checkpoint(path)
        reason = str(exception) or type(exception).__name__
        summary = next((cb for cb in trainer.callbacks if isinstance(cb, RunSummary)), None)
        if summary is not None:
            try:
                summary.write_stopped(trainer, pl_module, status, reason, path)
            except OSError as exc:  # the full disk may not take even the summary
                print(f"summary.json not written ({exc.strerror or exc})", file=sys.stderr, flush=True)
        if trainer.is_global_zero and path is not None:
            saved = "no checkpoint written (disk full); the previous one is" if isinstance(
                exception, DiskFullError) else "checkpoint saved to"
            print(f"run {status} at step {trainer.global_step} ({reason}); {saved} {path}; resume "
                  f"with --ckpt_path {path}", file=sys.stderr, flush=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, not in teardown: Lightning restores its own signal handlers before the teardown hooks run
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        while self._previous:
            signum, handler = self._previous.popitem()
            signal.signal(signum, handler)
