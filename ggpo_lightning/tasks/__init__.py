"""Synthetic math tasks: procedurally generated problems with gold answers."""

from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits

__all__ = ["ArithmeticTask", "write_splits"]
