"""Synthetic math tasks: procedurally generated problems with gold answers."""

from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits
from ggpo_lightning.tasks.synth_math import SynthMathConfig, SynthMathTask, generate_synth_splits, write_synth_splits

__all__ = ["ArithmeticTask", "SynthMathConfig", "SynthMathTask", "generate_synth_splits", "write_splits",
           "write_synth_splits"]
