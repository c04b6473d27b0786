"""What happens around the optimizer update, whatever the objective: the step's wall clock, gradients freed at
once, clipping under bf16 with a fused optimizer, and the policy for non-finite losses."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ggpo_lightning.core.schedule import LRScheduleConfig, lr_multiplier
from ggpo_lightning.models.compiled import compile_metrics
from ggpo_lightning.models.policy import Policy
from ggpo_lightning.records.errors import SettingsError

__all__ = ["NanGuard", "UpdateHooks"]

log = logging.getLogger(__name__)


class UpdateHooks(L.LightningModule):
    """LightningModule hooks of the update, and the step's metrics record.

    The step's metrics go to :attr:`last_step_metrics` (:meth:`record_step_metrics`) and, after the update, to the
    loggers in one row (``log_every_n_steps`` honoured), not through ``self.log``: Lightning's ``self.log`` costs
    ~0.2 ms per metric and call on CPU, 10 ms for a step's ~45 metrics (``docs/PERFORMANCE.md``). A training step
    that returns ``train_start`` (its clock) and ``train_tokens`` gets ``train/train_seconds`` and
    ``train/train_tokens_per_s`` recorded after the update (on a GPU also ``train/peak_memory_gb``,
    ``torch.cuda.max_memory_allocated``), with ``train/grad_norm`` (:meth:`configure_gradient_clipping`). The subclass
    sets the attributes annotated here."""

    optimizer_factory: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    """The learner's trainable parameters -> the optimizer (``model.optimizer``)."""
    lr_schedule: LRScheduleConfig | None
    """``model.lr_scheduler``; None: a constant learning rate."""
    policy: Policy
    """Learner and reference; the optimizer covers :meth:`~ggpo_lightning.models.policy.Policy.trainable_parameters`."""

    last_step_metrics: dict[str, float]
    """The latest training step's metrics as written to the loggers (``train/...`` keys, floats), for callbacks;
    empty before the first step. ``trainer.callback_metrics`` holds only the progress bar's values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_step_metrics = {}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.last_step_metrics = {}

    def record_step_metrics(self, metrics: dict[str, torch.Tensor | float], nan_means_none: bool = False) -> None:
        """Adds scalar ``metrics`` to :attr:`last_step_metrics`, the tensors with one device-to-host copy. With
        ``nan_means_none`` a NaN value is left out of the row (a mean over no responses, e.g. ``logratio_correct``
        without a correct one); otherwise it is recorded as it is."""
        tensors = {n: v for n, v in metrics.items() if isinstance(v, torch.Tensor)}
        values = {n: float(v) for n, v in metrics.items() if n not in tensors}
        if tensors:
            stacked = torch.stack([v.detach().to(self.device, torch.float64).reshape(()) for v in tensors.values()])
            values.update(zip(tensors, stacked.tolist()))
        self.last_step_metrics.update((n, v) for n, v in values.items() if not (nan_means_none and math.isnan(v)))

    def configure_optimizers(self) -> Any:
        """The optimizer over the learner's trainable parameters; with ``model.lr_scheduler``, its schedule
        stepped after every optimizer step (checkpointed with it)."""
        optimizer = self.optimizer_factory(self.policy.trainable_parameters())
        schedule = self.lr_schedule
        if schedule is None:
            return optimizer
        total = schedule.total_steps or self.trainer.max_steps
        if schedule.decay != "constant" and not (total and total > schedule.warmup_steps):
            raise SettingsError(f"model.lr_scheduler.decay: {schedule.decay} needs model.lr_scheduler.total_steps "
                                f"or trainer.max_steps above warmup_steps, got max_steps {self.trainer.max_steps}")
        factor = functools.partial(lr_multiplier, warmup_steps=schedule.warmup_steps, total_steps=total,
                                   decay=schedule.decay, min_lr_ratio=schedule.min_lr_ratio)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, factor), "interval": "step"}}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Here the backward pass and the optimizer update are done: the step's full training time.
        if outputs:  # not a skipped step
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - outputs["train_start"]
            metrics = {"train/train_seconds": seconds,
                       "train/train_tokens_per_s": outputs["train_tokens"] / max(seconds, 1e-9)}
            if self.device.type == "cuda":  # the run's peak so far, to hold against the estimate printed at start
                metrics["train/peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
            self.record_step_metrics(metrics)
        if self.policy.compiled:  # after the backward: its graphs' compile time counted in the step's row
            self.record_step_metrics({f"train/{k}": v for k, v in compile_metrics().items()})
        _write_row(self.trainer, self.last_step_metrics)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Nothing here: gradients are freed right after each update (:meth:`optimizer_step`). Lightning would zero
        them between the training step and its backward, where a micro-batched step has already accumulated all
        its micro-batches but the last."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The update, then the gradients freed (``set_to_none``) at once rather than when the next backward
        starts: the next rollout and forward run without a model-sized gradient buffer (lower peak memory)."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Records ``train/grad_norm``, the L2 norm of the learner's accumulated gradient before clipping, and clips
        by norm with that same total (one pass over the gradients for both); clipping by value is Lightning's.

        Also under bf16 mixed precision with a fused optimizer (``fused=True``): Lightning refuses to clip for
        optimizers that unscale gradients themselves whenever mixed precision is on, because fp16's loss scaler
        would have it clip scaled gradients. bf16 has no scaler: the gradients are the true ones, clipped here
        directly. Under fp16 (a scaler) everything but the norm goes to Lightning, which refuses as it should.
        """
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:  # a skipped step: nothing was back-propagated
            return
        total = torch.nn.utils.get_total_norm([p.grad for p in params])  # a DTensor under FSDP2
        self.record_step_metrics({"train/grad_norm": _full(total)})
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if not gradient_clip_val or scaler is not None or (gradient_clip_algorithm == "value" and not fused):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grads_with_norm_(params, gradient_clip_val, total)


def _write_row(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """``metrics`` as one row of every logger, numbered and thinned out as Lightning numbers and thins its own rows
    (``trainer.log_every_n_steps``; a stopping run's last step always), so that they line up with the validation
    rows Lightning writes."""
    step = trainer.fit_loop.epoch_loop._batches_that_stepped  # Lightning's row number; it has no public accessor
    every = trainer.log_every_n_steps
    if not metrics or not every or ((step + 1) % every and not trainer.should_stop):
        return
    row = {**metrics, "epoch": trainer.current_epoch}
    for logger in trainer.loggers:
        logger.log_metrics(row, step=step)
        logger.save()


def _full(value: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) gradient's norm reduced over its shards; a plain tensor as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


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
