"""The one owner of the rollout source in the glue: :class:`RolloutLoop`.

The rollout source (:class:`~ggpo_lightning.rollouts.source.RolloutSource`: the engine, the verifier and the
schedule behind one interface) lives from the module's construction to the end of ``fit``. Every step of that life
is here, and nowhere else in the glue:

- made from ``model.rollout`` with the module's :class:`~ggpo_lightning.rollouts.group.GroupRollout` and the
  learner's weights as the engine loads them;
- at ``setup``: refused for a run its schedule does not take (``data.mode``, processes with an engine of their own),
  connected to the DataModule's prompt stream (every rank's prompts of each step: the source splits them) (:meth:`~ggpo_lightning.training.data.PromptGroupDataModule.step_prompts`), and given to
  the DataModule, which draws each step's fresh groups from it;
- after every ``model.rollout.sync_every``-th update: the learner's weights published to the engine, tagged with the
  step (the staleness schedule);
- in checkpoints: one :class:`~ggpo_lightning.models.checkpoint.RolloutState` (engine weights and version, the
  backlog produced ahead, the prompt stream's position), read under the source's
  :meth:`~ggpo_lightning.rollouts.source.RolloutSource.prompts_frozen`, so that no prompt is both queued and still
  to come, or neither;
- when training starts, the first push, once: to an engine that samples only with pushed weights (vLLM servers), and
  on resume to one whose checkpoint left its weights to the learner's (the checkpoint's engine and backlog are
  restored before). Not earlier: Lightning calls ``setup`` before the strategy moves the learner to its device, and
  restores a sharded strategy's weights after;
- closed once: when training ends (before the final evaluation, which rollouts ahead would compete with for the
  cores), at teardown, or when the run fails or is interrupted (a signal: ``RunGuard``).

Lightning's order, which this relies on (lightning 2.6): ``setup`` of the DataModule, then of callbacks, then of the
module; on resume, the module's ``on_load_checkpoint`` (which calls :meth:`RolloutLoop.restore`), the weights, the
DataModule's ``load_state_dict``, then the callbacks'; all before ``on_train_start``, with or without a strategy that
restores after its own setup (FSDP). Saving calls the module's ``on_save_checkpoint`` last, which asks
:meth:`RolloutLoop.checkpoint_state`. On an exception, callbacks' ``on_exception`` run (checkpoint callbacks last, so
``RunGuard`` saves ``aborted.ckpt`` after the source is closed: a closed source still reports its state) and no
``teardown`` hook does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
import lightning as L

from ggpo_lightning.core.distributed import world
from ggpo_lightning.models.checkpoint import RolloutState
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.protocol import Weights
from ggpo_lightning.rollouts.group import GroupRollout
from ggpo_lightning.rollouts.source import RolloutSource, make_source
from ggpo_lightning.training.callbacks import EveryNUpdates, RunSummary
from ggpo_lightning.training.data import PromptGroupDataModule

__all__ = ["RolloutLoop"]


class RolloutLoop(EveryNUpdates):
    """Owns the run's rollout source (see the module docstring): connects it, publishes to it every ``sync_every``
    updates, checkpoints and restores it, and closes it exactly once.

    Args:
        config: ``model.rollout`` (schedule, ``sync_every``, the async bound).
        rollout: prompts in, scored groups out, with the module's engine.
        weights: the learner's weights as the engine loads them (merged LoRA, gathered shards).
    """

    def __init__(self, config: RolloutConfig, rollout: GroupRollout, weights: Callable[[], Weights]) -> None:
        super().__init__(config.sync_every)
        self.source: RolloutSource = make_source(config, rollout, weights)
        self.datamodule: PromptGroupDataModule | None = None
        """The prompt stream and the consumer of the groups (connected at :meth:`setup`)."""
        self.closed = False
        self._sync_on_start = False  # servers, or a restored checkpoint that left the engine's weights to the learner's

    @property
    def state_key(self) -> str:
        # the sync schedule's state (the last step it published at) kept its key from before this class owned the
        # source: checkpoints of either restore it
        return "RolloutSync"

    # ------------------------------------------------------------------ connecting

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if not isinstance(datamodule, PromptGroupDataModule):
            return
        errors = self.source.run_errors(datamodule.mode, world()[1])
        if errors:
            raise SettingsError("; ".join(errors))
        self.source.start(RunSummary.run_dir(trainer))
        self._sync_on_start = self.source.syncs_first
        self.source.connect(datamodule.step_prompts)
        datamodule.source = self.source
        self.datamodule = datamodule

    # ------------------------------------------------------------------ the staleness schedule

    def act(self, pl_module: L.LightningModule) -> None:
        self.sync(pl_module.global_step)

    def sync(self, version: int) -> None:
        """The learner's current weights to the engine, tagged ``version`` (the optimizer step they are from)."""
        self.source.publish(version=version)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """No generation inside (held-out evaluation shares the RNG and the verifier with rollouts)."""
        return self.source.paused()

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self, step: int) -> RolloutState:
        """The engine (weights as of the last publish, None when they are the learner's at ``step``), the backlog and
        the prompt stream's position, the last two read together."""
        with self.source.prompts_frozen():  # the source may take prompts while the learner trains
            backlog = self.source.state_dict()
            prompts = None if self.datamodule is None else self.datamodule.prompt_state()
        version, weights = self.source.engine_checkpoint(step)
        return RolloutState(version, weights, backlog, prompts)

    def restore(self, state: RolloutState) -> None:
        """A checkpoint's :class:`RolloutState`: the backlog (trained on first), the prompt stream's position and the
        engine; an engine whose weights were the learner's is re-synced when training starts (the learner's weights
        load after this)."""
        self.source.load_state_dict(state.backlog)
        if state.prompts is not None and self.datamodule is not None:
            self.datamodule.load_prompt_state(state.prompts)
        resync = self.source.restore_engine(state.engine_state, state.engine_version)
        self._sync_on_start = resync or self._sync_on_start

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The first push (the module docstring), once: the strategy has placed the learner and restored its
        weights; on resume, ``global_step`` is the checkpoint's (its engine version)."""
        if self._sync_on_start:
            self.sync(trainer.global_step)
            self._sync_on_start = False

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop producing and release the engine's processes, once; the source still reports its state (a checkpoint
        taken after a failure)."""
        if not self.closed:
            self.closed = True
            self.source.close()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.close()  # before the final evaluation: rollouts ahead would compete for the cores

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.close()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":  # a validate or test call leaves the source to the training that may follow
            self.close()
