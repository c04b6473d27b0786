"""Sample completions of the run, for people watching it: every N optimizer steps a few of the step's rollout
groups, each response with its prompt, reward and length, appended to ``samples.jsonl`` in the run folder and
shown by the logger (a TensorBoard text panel, a W&B table; the CSV logger has the JSONL only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from ggpo_lightning.records.errors import SettingsError

__all__ = ["SAMPLES_FILE", "SampleLog"]

SAMPLES_FILE = "samples.jsonl"
COLUMNS = ("step", "prompt_id", "prompt", "response", "reward", "length")


class SampleLog(L.Callback):
    """Every ``every_n_steps`` optimizer steps (0 = never), the first ``groups`` prompt groups of the step (all
    their K responses) as rows ``{step, prompt_id, prompt, response, reward, length}`` (``length`` in response
    tokens): appended to ``<run dir>/samples.jsonl`` and given to the loggers that show text. Rank 0's groups only
    (each rank trains on its own share of the step).

    Args:
        every_n_steps: write samples every this many optimizer steps; 0 = never.
        groups: how many of the step's prompt groups to write, each with all of its K responses.
    """

    def __init__(self, every_n_steps: int = 50, groups: int = 2) -> None:
        if every_n_steps < 0:
            raise SettingsError(f"samples.every_n_steps must be >= 0 (0 = no samples), got {every_n_steps}")
        if groups < 1:
            raise SettingsError(f"samples.groups must be >= 1, got {groups}")
        self.every_n_steps, self.groups = every_n_steps, groups
        self.run_dir: Path | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, on every rank: trainer.log_dir is a collective (a broadcast from rank 0) that rank 0 alone must not
        # call mid-run, where the other ranks wait in another collective
        self.run_dir = Path(trainer.log_dir or trainer.default_root_dir)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        groups = getattr(batch, "groups", None)
        if not self.every_n_steps or step % self.every_n_steps or not trainer.is_global_zero or not groups:
            return
        rows = [{"step": step, "prompt_id": g.prompt_id, "prompt": g.prompt, "response": response,
                 "reward": float(reward), "length": len(ids)}
                for g in groups[:self.groups] for response, reward, ids in zip(g.responses, g.rewards, g.response_ids)]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / SAMPLES_FILE).open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        for logger in trainer.loggers:
            _show(logger, rows, step)


def _show(logger: Any, rows: list[dict[str, Any]], step: int) -> None:
    """``rows`` on a logger that shows text: a W&B table, a TensorBoard text panel (markdown); others: nothing."""
    if isinstance(logger, WandbLogger):
        logger.log_table(key="samples", columns=list(COLUMNS), data=[[r[c] for c in COLUMNS] for r in rows],
                         step=step)
    elif isinstance(logger, TensorBoardLogger):
        def cell(value: Any) -> str:  # one markdown table cell: no pipes or line breaks inside
            return str(value).replace("|", "\\|").replace("\n", "<br>")

        table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        table += ["| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |" for r in rows]
        logger.experiment.add_text("samples", "\n".join(table), global_step=step)
