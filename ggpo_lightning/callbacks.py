"""Callbacks of a training run: held-out accuracy before/after, export, ``summary.json``."""

from __future__ import annotations

import abc
import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar

from ggpo_lightning.atomic import atomic_write_text
from ggpo_lightning.distributed import sum_across_ranks
from ggpo_lightning.export import write_folder

__all__ = ["ReferenceRefresh", "RolloutSync", "RunSummary", "StepProgressBar"]


class _EveryNUpdates(L.Callback, abc.ABC):
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


class RolloutSync(_EveryNUpdates):
    """Copies the learner into the rollout engine every N optimizer updates (N = 1: near on-policy)."""

    def act(self, pl_module: L.LightningModule) -> None:
        pl_module.sync_rollout_engine()


class ReferenceRefresh(_EveryNUpdates):
    """Copies the learner into the frozen reference every M optimizer updates (the paper: 160)."""

    def act(self, pl_module: L.LightningModule) -> None:
        pl_module.refresh_reference()


class StepProgressBar(RichProgressBar):
    """Rich progress bar of a step-based run: ``step`` with optimizer steps of ``max_steps`` (``ggpo-train`` runs
    one endless epoch, where Lightning's bar would read "Epoch 0/-2"), and the few metrics a user watches:
    ``reward``, ``staleness``, ``loss`` and the latest held-out ``val_acc``."""

    SHOWN = {"train/reward": "reward", "train/staleness": "staleness", "train/loss": "loss", "val/accuracy": "val_acc"}

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
    model in ``final_model/`` on request (:func:`~ggpo_lightning.export.export_targets`). ``summary.json`` in the
    run directory holds ``accuracy_before``, ``accuracy_after`` (fractions),
    ``optimizer_steps``, ``generated_samples``, ``wall_seconds``, ``recipe`` and the export
    folders (``final_model``, with LoRA ``final_adapter``; null when not written).

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
        generated = int(sum_across_ranks(torch.tensor([pl_module.generated_samples], dtype=torch.float64,
                                                          device=pl_module.device)).item())
        if not trainer.is_global_zero:
            return
        for target, write in exported.items():
            write_folder(target, write)
        exported_names = {target.name: str(target) for target in exported}
        summary = {
            "recipe": self.recipe,
            "objective": pl_module.objective.name,
            "accuracy_before": self.accuracy_before,
            "accuracy_after": accuracy_after,
            "optimizer_steps": trainer.global_step,
            "generated_samples": generated,
            "skipped_nan_steps": pl_module.nan_steps,
            "wall_seconds": round(self._wall_before + time.perf_counter() - self._start, 2),
            "val_prompts": len(rows),
            "final_model": exported_names.get("final_model"),
        }
        if pl_module.policy.lora is not None:
            summary["final_adapter"] = exported_names.get("final_adapter")
        path = run_dir / "summary.json"
        atomic_write_text(path, json.dumps(summary, indent=2) + "\n")
        self._print_table(summary)
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
