"""The checkpoint side of the module: its own state beyond the weights
(:class:`~ggpo_lightning.models.checkpoint.RunState`), what a resume must match, and the rollout side's state, which
its owner saves and restores (:class:`~ggpo_lightning.training.rollout_loop.RolloutLoop`)."""

from __future__ import annotations

from typing import Any

import lightning as L

from ggpo_lightning.core.distributed import all_gather_objects
from ggpo_lightning.core.objectives import ObjectiveConfig
from ggpo_lightning.models.checkpoint import (CHECKPOINT_KEY, RunState, check_fingerprint, current_rank_state,
                                              restore_rank_state, run_fingerprint)
from ggpo_lightning.models.policy import Policy
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.group import GroupRollout
from ggpo_lightning.training.hooks import NanGuard
from ggpo_lightning.training.rollout_loop import RolloutLoop
from ggpo_lightning.training.settings import run_settings

__all__ = ["CheckpointHooks"]


class CheckpointHooks(L.LightningModule):
    """Saves and restores ``checkpoint["ggpo"]``. The subclass sets the attributes annotated here."""

    rollout_loop: RolloutLoop
    """The rollout source's owner; its :class:`~ggpo_lightning.models.checkpoint.RolloutState` is part of the run
    state."""
    policy: Policy
    group_rollout: GroupRollout
    """Its ``generated_samples`` are per-rank state."""
    nan_guard: NanGuard
    objective_config: ObjectiveConfig
    rollout_config: RolloutConfig
    model_name_or_path: str
    resume_mismatch_ok: bool
    """Resume a checkpoint of another run (a warning instead of an error)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Called on every rank; Lightning writes rank 0's dict, so the per-rank state is gathered into it.
        ranks = all_gather_objects(current_rank_state(self.group_rollout.generated_samples))
        rollout = self.rollout_loop.checkpoint_state(self.global_step)
        checkpoint[CHECKPOINT_KEY] = RunState(self.model_name_or_path, rollout, self.nan_guard.total, ranks,
                                              self.policy.lora_state(), self.run_fingerprint()).to_dict()

    def run_fingerprint(self) -> dict[str, Any]:
        """What a resume must match (:func:`~ggpo_lightning.models.checkpoint.run_fingerprint`): the settings that
        define the run and, with a DataModule attached, the training data's fingerprint."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        settings = run_settings(self.objective_config, self.rollout_config, self.model_name_or_path,
                                getattr(datamodule, "prompts_per_step", None))
        return run_fingerprint(settings, datamodule.fingerprint() if datamodule is not None else None)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = RunState.from_checkpoint(checkpoint)
        # the specific LoRA/base check first: its message says which model to load
        self.policy.check_resumable(state, self.model_name_or_path)
        check_fingerprint(state, self.run_fingerprint(), self.resume_mismatch_ok)
        self.rollout_loop.restore(state.rollout)
        self.nan_guard.total = state.nan_steps
        self.group_rollout.generated_samples = restore_rank_state(state.ranks)
        if state.lora is not None:
            self.policy.lora_merges = state.lora.merges
