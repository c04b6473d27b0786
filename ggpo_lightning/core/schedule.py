"""The learning-rate schedule: warmup, then constant, linear or cosine decay to a floor. A pure function of the
optimizer step (``torch.optim.lr_scheduler.LambdaLR`` multiplies the optimizer's learning rate by it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DECAYS", "LRScheduleConfig", "lr_multiplier"]

DECAYS = ("constant", "linear", "cosine")


@dataclass
class LRScheduleConfig:
    """Recipe group ``model.lr_scheduler``: the optimizer's learning rate times :func:`lr_multiplier`."""

    warmup_steps: int = 0
    """Linear warmup from 0 over this many optimizer steps."""
    decay: str = "constant"
    """After warmup: ``constant``, ``linear`` or ``cosine`` down to ``min_lr_ratio`` at ``total_steps``."""
    total_steps: int | None = None
    """Where the decay ends; None = ``trainer.max_steps``."""
    min_lr_ratio: float = 0.0
    """The floor of the decay, as a fraction of the optimizer's learning rate."""

    def errors(self) -> list[str]:
        errors = []
        if self.warmup_steps < 0:
            errors.append(f"model.lr_scheduler.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.decay not in DECAYS:
            errors.append(f"model.lr_scheduler.decay must be one of {list(DECAYS)}, got {self.decay!r}")
        if self.total_steps is not None and self.total_steps <= self.warmup_steps:
            errors.append(f"model.lr_scheduler.total_steps ({self.total_steps}) must exceed warmup_steps "
                          f"({self.warmup_steps})")
        if not 0 <= self.min_lr_ratio <= 1:
            errors.append(f"model.lr_scheduler.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        return errors


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, decay: str, min_lr_ratio: float) -> float:
    """The learning rate's factor at optimizer step ``step`` (0-based: the factor the update at ``step`` uses)::

        step < warmup:  (step + 1) / warmup
        after:          floor + (1 - floor) * shape(p),  p = (step - warmup) / (total - warmup) clipped to [0, 1]
                        shape = 1 (constant), 1 - p (linear), (1 + cos(pi p)) / 2 (cosine)
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape
