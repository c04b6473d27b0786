"""Public test doubles: a tiny model configuration and fixed prompt groups.

Users testing their own plugins or recipes can build everything offline with these,
in seconds, on a CPU.
"""

from __future__ import annotations

from dataclasses import replace

from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.tasks.tiny_model import TinyModelConfig
from ggpo_lightning.tasks.arithmetic import ArithmeticTask

__all__ = ["TINY_TEST_MODEL", "make_group"]

TINY_TEST_MODEL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                  max_position_embeddings=64, sft_steps=40, sft_batch_size=32,
                                  task=ArithmeticTask(max_operand=9, ops="+"))
"""A ~25k-parameter model with a short warm-up on one-digit sums: builds in a few seconds."""


def make_group(prompt_ids: list[int], response_ids: list[list[int]], rewards: list[float],
               version: int = 0, prompt_id: str = "p0", **fields) -> RolloutGroup:
    """A RolloutGroup with placeholder texts, for tests that only need tokens and rewards."""
    group = RolloutGroup(prompt_id=prompt_id, prompt="", gold="", prompt_ids=prompt_ids,
                         response_ids=response_ids, responses=[""] * len(response_ids), rewards=rewards,
                         behavior_version=version)
    return replace(group, **fields) if fields else group
