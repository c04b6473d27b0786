"""Where a training step's fresh groups come from: :class:`RolloutSource`, with the synchronous and the
asynchronous schedule (``model.rollout.schedule``) behind one interface.

The glue never asks which schedule runs. Every place the choice matters is a method here:

- :meth:`~RolloutSource.next_batch`: this rank's share of the step's groups, rolled out now by every rank
  (:class:`SyncSource`) or taken from the producer thread's queue on rank 0 and scattered (:class:`AsyncSource`,
  :mod:`~ggpo_lightning.rollouts.producer`), with what producing them cost (:class:`RolloutBatch`: the rollout's
  metrics travel with its groups);
- :meth:`~RolloutSource.roll_out`: given prompts rolled out at once in the caller (the offline fill);
- :meth:`~RolloutSource.publish`: the learner's weights to the engine after an update (loaded in place, or handed
  over for the producer to load at its next batch boundary);
- :meth:`~RolloutSource.paused`: no generation inside (held-out evaluation shares the RNG and the verifier);
- :meth:`~RolloutSource.prompts_frozen`, :meth:`~RolloutSource.state_dict` / :meth:`~RolloutSource.load_state_dict`,
  :meth:`~RolloutSource.engine_checkpoint` / :meth:`~RolloutSource.restore_engine`: checkpoints;
- :meth:`~RolloutSource.run_errors`: what the schedule does not run with;
- :meth:`~RolloutSource.close`: stop producing, release the engine's processes.

**Several trainer processes.** The prompt stream gives every rank the whole step's prompts in one order; the source
decides who rolls out what. Synchronous: each rank its own share (every ``world``-th prompt from its rank on,
:func:`~ggpo_lightning.core.distributed.rank_share`), and a rank whose rollout failed makes every rank fail at the
same point (:func:`~ggpo_lightning.core.rank_agreement.failing_together`). Asynchronous: rank 0 alone runs the
producer, for the whole step, and :meth:`AsyncSource.next_batch` scatters each rank's share of every batch
(:func:`~ggpo_lightning.core.rank_agreement.from_rank0`), or rank 0's error, so that every rank raises it. Pushes
stay collective (the learner's gathers) and are made in the learner's thread on every rank; the engine makes every
rank agree on their outcome (:meth:`~ggpo_lightning.rollouts.protocol.RolloutEngine.load_weights`). Rank 0's backlog
is the whole run's: checkpoints keep their schema, and a checkpoint of one process resumes on several and back.
"""

from __future__ import annotations

import abc
import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from ggpo_lightning.core.distributed import rank_share, world
from ggpo_lightning.core.rank_agreement import failing_together, from_rank0
from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine, Weights, weight_pairs
from ggpo_lightning.rollouts.group import GroupRollout, RolloutCounts
from ggpo_lightning.rollouts.producer import ProducedBatch, RolloutProducer

__all__ = ["AsyncSource", "RolloutBatch", "RolloutSource", "SyncSource", "async_run_errors", "make_source"]

Prompts = Callable[[], list[PromptRow]]
"""The next step's prompts: every rank's, in the one order all ranks walk."""


@dataclass
class RolloutBatch:
    """Groups fresh from the rollout engine, with what producing them cost."""

    groups: list[RolloutGroup]
    counts: RolloutCounts = field(default_factory=RolloutCounts)
    """Seconds, tokens and verifier outcomes of these groups (zero for groups restored from a checkpoint)."""
    wait_seconds: float | None = None
    """Async: how long the learner waited for them (None: the sync schedule, where the rollout is the wait)."""
    over_staleness: int | None = None
    """Async: groups consumed past ``model.rollout.max_staleness`` (used anyway; :mod:`~.producer`)."""
    queued: int | None = None
    """Async: batches still queued after this one."""

    def metrics(self) -> dict[str, float]:
        """``rollout_seconds`` (of which ``rollout_verify_seconds`` waiting for the verifier), ``rollout_tokens_per_s``
        (response tokens), ``rollout_prompt_tokens``, the verifier's ``verifier/*`` counts and the engine's own
        (:attr:`RolloutCounts.engine`); with the async
        schedule also ``rollout_wait_seconds``, ``over_staleness`` and ``async_queue``."""
        counts = self.counts
        metrics = {"rollout_seconds": counts.seconds, "rollout_verify_seconds": counts.verify_seconds,
                   "rollout_tokens_per_s": counts.tokens / max(counts.seconds, 1e-9),
                   "rollout_prompt_tokens": float(counts.prompt_tokens), **counts.engine,
                   **{k: float(v) for k, v in counts.verifier.as_dict(prefix="verifier/").items()}}
        if self.wait_seconds is not None:
            metrics.update(rollout_wait_seconds=self.wait_seconds, over_staleness=float(self.over_staleness or 0),
                           async_queue=float(self.queued or 0))
        return metrics


class RolloutSource(abc.ABC):
    """Turns the prompt stream into scored groups with one engine, on a schedule.

    Args:
        rollout: prompts in, scored groups out (the engine, the verifier, the counts).
        weights: the learner's weights as the engine loads them (merged LoRA, gathered shards), read at each
            :meth:`publish`.

    The prompt stream is connected later (:meth:`connect`; the DataModule owns it).
    """

    def __init__(self, rollout: GroupRollout, weights: Callable[[], Weights]) -> None:
        self.rollout, self.weights = rollout, weights
        self.prompts: Prompts | None = None

    def start(self, run_dir: Path) -> None:
        """Start what the engine runs beside the trainer (local vLLM servers, their logs under ``run_dir``); a no-op
        for the other engines. Pushes nothing: the strategy has not placed the learner yet (:attr:`syncs_first`)."""
        start = getattr(self.engine, "start", None)
        if start is not None:
            start(run_dir)

    @property
    def syncs_first(self) -> bool:
        """The engine samples only with weights the run pushed (vLLM servers): :meth:`publish` before the first
        rollout, once the strategy has placed the learner (on a GPU, NCCL takes only tensors on its device)."""
        return getattr(self.engine, "sync_before_rollouts", False)

    def connect(self, prompts: Prompts) -> None:
        """The next step's prompts, the whole step's (called by :meth:`next_batch`, or by rank 0's producer thread
        under :meth:`prompts_frozen`)."""
        self.prompts = prompts

    def next_prompts(self) -> list[PromptRow]:
        if self.prompts is None:
            raise RuntimeError("the rollout source has no prompt stream: the DataModule connects one "
                               "(PromptGroupDataModule.connect_source)")
        return self.prompts()

    @property
    def engine(self) -> RolloutEngine:
        return self.rollout.engine

    @abc.abstractmethod
    def next_batch(self, step: int) -> RolloutBatch:
        """This rank's groups for the learner's step ``step`` (on every rank at the same point: it may be a
        collective)."""

    def roll_out(self, rows: Sequence[PromptRow], per_call: int) -> RolloutBatch:
        """``rows`` rolled out now, in the caller, ``per_call`` prompts per engine call (the offline fill)."""
        with self.paused():
            groups = [g for start in range(0, len(rows), per_call) for g in self.rollout(rows[start:start + per_call])]
            return RolloutBatch(groups, self.rollout.take_counts())

    @abc.abstractmethod
    def publish(self, version: int) -> None:
        """The learner's current weights (:attr:`weights`), tagged ``version``, to the engine."""

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """No generation inside the context (the caller may use the RNG and the verifier)."""
        return contextlib.nullcontext()

    def prompts_frozen(self) -> contextlib.AbstractContextManager[Any]:
        """No prompt is taken from the stream inside: hold it to save the prompt order with :meth:`state_dict`."""
        return contextlib.nullcontext()

    def engine_checkpoint(self, step: int) -> tuple[int, dict[str, Tensor] | None]:
        """``(version, weights)`` of the engine for a checkpoint at ``step`` (:meth:`RolloutEngine.state_dict`)."""
        return self.engine.version, self.engine.state_dict(step)

    def restore_engine(self, state: dict[str, Tensor] | None, version: int) -> bool:
        """A checkpoint's engine weights and version; True when the engine must be re-synced (:meth:`publish`)."""
        return self.engine.load_state_dict(state, version)

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint must hold beyond the engine (async: batches produced ahead); None: nothing."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (of either schedule's run)."""

    def run_errors(self, data_mode: str, processes: int) -> list[str]:
        """What this schedule does not run with, given the run's ``data.mode`` and number of processes."""
        return []

    def close(self) -> None:
        """Stop producing; release the engine's processes. Idempotent."""
        self.engine.close()


class SyncSource(RolloutSource):
    """Generation and training take turns: each step rolls out its prompts with the engine as last synced."""

    def next_batch(self, step: int) -> RolloutBatch:
        rank, world_size = world()
        with failing_together():  # a rank whose servers are gone stops every rank here, not at the next all-reduce
            groups = self.rollout(rank_share(self.next_prompts(), rank, world_size))
        return RolloutBatch(groups, self.rollout.take_counts())

    def publish(self, version: int) -> None:
        self.engine.load_weights(self.weights(), version=version)

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state and state.get("queued"):
            warnings.warn(f"the checkpoint holds {len(state['queued'])} batch(es) produced ahead by "
                          "model.rollout.schedule: async; this run is synchronous and rolls out anew", stacklevel=2)


class AsyncSource(RolloutSource):
    """A producer thread rolls out the next steps' groups while the learner trains, staleness at most
    ``staleness_limit`` (:class:`~ggpo_lightning.rollouts.producer.RolloutProducer`; it starts at the first
    :meth:`next_batch`, after the batches a checkpoint restored). On several processes it runs on rank 0 only, for
    every rank (the module docstring), and the engine must serve every rank (``engine: vllm_server``)."""

    def __init__(self, rollout: GroupRollout, weights: Callable[[], Weights], staleness_limit: int,
                 engine_name: str) -> None:
        super().__init__(rollout, weights)
        self.engine_name = engine_name
        self.producer = RolloutProducer(rollout, rollout.engine, self.next_prompts, staleness_limit,
                                        take_counts=rollout.take_counts)
        self._restored: dict[str, Any] = {"queued": [], "in_flight": None}

    def next_batch(self, step: int) -> RolloutBatch:
        """Rank 0 takes the step's batch from the producer and each rank gets its share of the groups, with counts
        that sum to the batch's over ranks (:meth:`RolloutCounts.for_rank`); when the producer failed, every rank
        raises its error. The other ranks' wait is their :attr:`RolloutBatch.wait_seconds`."""
        requested = time.monotonic()
        groups, counts, wait_seconds, over_staleness, queued = from_rank0(lambda: self._take_shares(step))
        if world()[0] != 0:  # rank 0's own wait was for the producer; the others' is for rank 0
            wait_seconds = time.monotonic() - requested
        return RolloutBatch(groups, counts, wait_seconds, over_staleness, queued)

    def _take_shares(self, step: int) -> list[tuple[list[RolloutGroup], RolloutCounts, float, int, int]]:
        """Rank 0: the producer's next batch, as every rank's share (in rank order)."""
        if not self.producer.started:
            self.producer.start(step, [ProducedBatch.from_dict(b) for b in self._restored["queued"]],
                                None if self._restored["in_flight"] is None else
                                [PromptRow(**row) for row in self._restored["in_flight"]])
        taken = self.producer.take(step)
        counts, queued = taken.counts or RolloutCounts(), len(self.producer.backlog()[0])
        world_size = world()[1]
        return [(rank_share(taken.groups, rank, world_size), counts.for_rank(rank), taken.wait_seconds,
                 taken.over_staleness, queued) for rank in range(world_size)]

    def publish(self, version: int) -> None:
        """Before the producer starts, or into an engine that takes weights while it generates (vLLM servers: the
        push pauses them), loaded now; else a copy of the weights (one more model in memory until the producer loads
        it) handed over for its next batch boundary."""
        if not self.producer.started or getattr(self.engine, "loads_while_generating", False):
            self.engine.load_weights(self.weights(), version=version)
            self.producer.weights_changed()
            return
        copy = {name: tensor.detach().clone() for name, tensor in weight_pairs(self.weights())}
        self.producer.publish(copy, version=version)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return self.producer.paused()

    def prompts_frozen(self) -> contextlib.AbstractContextManager[Any]:
        return self.producer.lock

    def engine_checkpoint(self, step: int) -> tuple[int, dict[str, Tensor] | None]:
        """The newest weights handed over, read safely against the producer's loads."""
        return self.producer.engine_checkpoint(step, self.engine.state_dict)

    def state_dict(self) -> dict[str, Any]:
        """The produced batches not yet trained on and the prompts of the one in progress (as restored, when not one
        step was taken since a resume)."""
        if not self.producer.started:
            return self._restored
        queued, in_flight = self.producer.backlog()
        return {"queued": [batch.to_dict() for batch in queued],
                "in_flight": None if in_flight is None else [asdict(row) for row in in_flight]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self._restored = state or {"queued": [], "in_flight": None}

    def run_errors(self, data_mode: str, processes: int) -> list[str]:
        return async_run_errors(data_mode, processes, self.engine_name)

    def close(self) -> None:
        self.producer.stop()
        super().close()


def make_source(config: RolloutConfig, rollout: GroupRollout, weights: Callable[[], Weights]) -> RolloutSource:
    """The source of ``model.rollout.schedule``."""
    if config.schedule == "async":
        return AsyncSource(rollout, weights, config.staleness_limit, config.engine)
    return SyncSource(rollout, weights)


def async_run_errors(data_mode: str, processes: int, engine: str) -> list[str]:
    """What ``model.rollout.schedule: async`` does not run with, beside its own settings (``RolloutConfig.errors``):
    checked by the preflight on the recipe and again when the module makes its source. On several processes rank 0
    rolls out for every rank: on servers every rank shares (``engine: vllm_server``), not on an engine of its own."""
    errors = []
    if data_mode != "online":
        errors.append(f"model.rollout.schedule: async needs data.mode: online (offline data is generated once, "
                      f"before training), got data.mode: {data_mode!r}")
    if processes > 1 and engine != "vllm_server":
        errors.append(f"model.rollout.schedule: async on several processes ({processes}) needs "
                      f"model.rollout.engine: vllm_server (rank 0 rolls out every rank's share on servers all ranks "
                      f"share), got engine: {engine!r} (set model.rollout.engine: vllm_server, model.rollout.schedule: "
                      "sync, or trainer.devices and trainer.num_nodes to 1)")
    return errors
