"""What happens around the optimizer update, whatever the objective: the step's wall clock, gradients freed at
once, clipping under bf16 with a fused optimizer, and the policy for non-finite losses."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

__all__ = ["NanGuard", "UpdateHooks"]

log = logging.getLogger(__name__)


class UpdateHooks(L.LightningModule):
    """LightningModule hooks of the update. A training step that returns ``train_start`` (its clock) and
    ``train_tokens`` gets ``train/train_seconds`` and ``train/train_tokens_per_s`` logged after the update."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Here the backward pass and the optimizer update are done: the step's full training time.
        if not outputs:  # a skipped step
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - outputs["train_start"]
        self.log_dict({"train/train_seconds": seconds,
                       "train/train_tokens_per_s": outputs["train_tokens"] / max(seconds, 1e-9)}, batch_size=1)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The update, then the gradients freed (``set_to_none``) at once rather than when the next backward
        starts: the next rollout and forward run without a model-sized gradient buffer (lower peak memory)."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping; under bf16 mixed precision also with a fused optimizer (``fused=True``).

        Lightning refuses to clip for optimizers that unscale gradients themselves whenever
        mixed precision is on, because fp16's loss scaler would have it clip scaled
        gradients. bf16 has no scaler: the gradients are the true ones, clipped here directly.
        """
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        if not (gradient_clip_val and fused and getattr(self.trainer.precision_plugin, "scaler", None) is None):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)


class NanGuard:
    """Skips steps with a non-finite loss; after ``max_in_a_row`` in a row saves ``nan-stop.ckpt`` in the run
    directory and stops the run (recipe key ``model.max_nan_steps``)."""

    def __init__(self, max_in_a_row: int) -> None:
        self.max_in_a_row = max_in_a_row
        self.total = 0
        """Steps skipped so far (checkpointed)."""
        self.streak = 0

    def passed(self) -> None:
        """A finite step: the streak ends."""
        self.streak = 0

    def skip(self, trainer: L.Trainer) -> int:
        """Count a skipped step of ``trainer``'s run (stopping it at the limit); the total so far."""
        self.total += 1
        self.streak += 1
        log.warning("non-finite loss at step %d: skipped (%d in a row, %d in all)", trainer.global_step, self.streak,
                    self.total)
        if self.streak >= self.max_in_a_row:
            path = Path(trainer.log_dir or trainer.default_root_dir) / "nan-stop.ckpt"
            trainer.save_checkpoint(path)
            trainer.should_stop = True
            log.error("%d non-finite losses in a row: stopping; checkpoint saved to %s. Lower the learning "
                      "rate or check the data and precision settings.", self.streak, path)
        return self.total
