"""A test-only callback that makes one rank's rollout fail, for the tests of what every rank does then.

Loaded by ``ggpo-train`` subprocesses (``tests/integration`` on ``PYTHONPATH``) by class path
(``rank_faults.FailingRollout``).
"""

from __future__ import annotations

import lightning as L

from ggpo_lightning.core.distributed import world
from ggpo_lightning.records.errors import RunAborted


class FailingRollout(L.Callback):
    """On rank ``rank``, the rollout of the ``call``-th step (1-based) raises ``RunAborted(message)``, as when that
    rank finds no rollout server usable; the other ranks' rollouts work."""

    def __init__(self, rank: int, call: int, message: str) -> None:
        self.rank, self.call, self.message = rank, call, message

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if world()[0] == self.rank:
            source = trainer.datamodule.source
            source.rollout = _Failing(source.rollout, self.call, self.message)


class _Failing:
    def __init__(self, rollout, call: int, message: str) -> None:
        self.rollout, self.call, self.message, self.calls = rollout, call, message, 0
        self.engine = rollout.engine

    def __call__(self, rows):
        self.calls += 1
        if self.calls == self.call:
            raise RunAborted(self.message)
        return self.rollout(rows)

    def take_counts(self):
        return self.rollout.take_counts()
