"""A test-only callback that records, on every rank, what each training step saw and did.

Loaded by ``ggpo-train`` subprocesses (``tests/integration`` on ``PYTHONPATH``) in
``test_distributed.py``; writes ``<out_dir>/rank<R>.jsonl``, one line per optimizer step.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from ggpo_lightning.core.distributed import world


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class RankTrace(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.record: dict = {}
        self.prompt_ids: list[str] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        draw = datamodule.next_batch

        def traced():
            batch = draw()
            self.prompt_ids = [g.prompt_id for g in batch.groups]
            return batch

        datamodule.next_batch = traced

    @staticmethod
    def _state(pl_module) -> dict:
        # right after a refresh the reference equals the learner exactly (compared shard by shard);
        # with LoRA there is no reference copy (None)
        reference = pl_module.reference
        same = None if reference is None else all(torch.equal(_local(r), _local(p)) for r, p in zip(
            reference.state_dict().values(), pl_module.learner.state_dict().values()))
        trainable = [_local(p).double().sum() for p in pl_module.learner.parameters() if p.requires_grad]
        model = getattr(pl_module.engine, "model", None)  # a vLLM engine's model lives in vLLM
        engine = None if model is None else float(sum(p.double().sum() for p in model.state_dict().values()))
        return {"engine_version": pl_module.engine.version, "reference_is_learner": same,
                "trainable_checksum": float(sum(trainable)), "engine_checksum": engine}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.record = {"step": trainer.global_step, **self._state(pl_module)}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._write({**self.record, "prompt_ids": self.prompt_ids, "local_loss": float(loss)})

    def on_train_end(self, trainer, pl_module) -> None:
        self._write({"step": trainer.global_step, "final": True, **self._state(pl_module)})

    def _write(self, line: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"rank{world()[0]}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
