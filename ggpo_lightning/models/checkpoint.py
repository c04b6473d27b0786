"""The checkpoint schema: what a ``ggpo-train`` checkpoint holds besides Lightning's own entries.

A checkpoint is Lightning's dict (``state_dict`` with ``learner.*`` and ``reference.*``
weights, optimizer, loops, callbacks, the DataModule's state) plus one entry,
``checkpoint["ggpo"]``: :class:`RunState`, written and read only through
:meth:`RunState.to_dict` / :meth:`RunState.from_dict`. ``ggpo eval`` reads the same
schema (:func:`read_checkpoint`). Torch only, no Lightning.

Schema versions: 1 (checkpoints written before the schema was made explicit) had no ``schema`` key and, before
per-rank state, kept one process's ``rng`` and ``generated_samples`` at the top level; both still load. 2 had no
``fingerprint``; such checkpoints resume with a warning that nothing was checked. Up to 3 the rollout side was
split: the engine's weights and version at the top level of this entry, the asynchronous backlog and the prompt
order in the DataModule's entry; 4 keeps all three in one :class:`RolloutState` (:meth:`RunState.from_checkpoint`
reads the older layout into it).
"""

from __future__ import annotations

import logging
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ggpo_lightning.records.errors import CheckpointError, ResumeError
from ggpo_lightning.core.distributed import world

__all__ = ["CHECKPOINT_KEY", "SCHEMA_VERSION", "SETTINGS_ADDED", "LoraState", "RankState", "RolloutState", "RunState",
           "check_fingerprint", "current_rank_state", "fingerprint_differences", "learner_weights", "read_checkpoint",
           "restore_rank_state", "run_fingerprint"]

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "ggpo"
SCHEMA_VERSION = 4
LEGACY_DATA_KEY = "PromptGroupDataModule"
"""The DataModule's entry of a checkpoint, where schemas up to 3 kept the asynchronous backlog (key ``"async"``)."""


@dataclass
class RankState:
    """One process's sampling state: what lets a resumed run draw what an uninterrupted one would."""

    rng: dict[str, Any]
    """``{"torch": torch RNG state, "python": random.getstate()}``."""
    generated_samples: int


@dataclass
class LoraState:
    """A LoRA run's adapter settings and the base it trains on."""

    settings: dict[str, Any]
    """``asdict(LoraSettings)``."""
    base_fingerprint: str
    """Fingerprint of the base model on disk (config and embedding)."""
    merges: int
    """Reference refreshes merged into the base so far."""


@dataclass
class RolloutState:
    """The rollout side of a run, read together: the engine that generates, what it generated that the learner has
    not trained on yet, and where the prompt stream stands (the next prompts the backlog did not take)."""

    engine_version: int
    """Optimizer step of the weights the rollout engine holds."""
    engine_state: dict[str, Tensor] | None
    """The engine's weights; None when equal to the learner's (re-synced on resume)."""
    backlog: dict[str, Any] | None = None
    """The rollout source's state (``RolloutSource.state_dict``: the asynchronous schedule's queued batches and the
    prompts of the batch in progress); None: nothing ahead of the learner."""
    prompts: dict[str, Any] | None = None
    """The prompt stream's position (``PromptGroupDataModule.prompt_state``); None in checkpoints up to schema 3,
    whose DataModule entry holds it."""

    def to_dict(self) -> dict[str, Any]:
        """Plain types for ``torch.save``; the engine's tensors as they are."""
        return {"engine_version": self.engine_version, "engine_state": self.engine_state, "backlog": self.backlog,
                "prompts": self.prompts}


@dataclass
class RunState:
    """``checkpoint["ggpo"]``: the module's state beyond its weights."""

    model_name_or_path: str
    """The base model the learner weights load into (what ``ggpo eval`` uses)."""
    rollout: RolloutState
    """The engine, the backlog and the prompt stream (:class:`RolloutState`)."""
    nan_steps: int
    """Skipped non-finite steps so far."""
    ranks: list[RankState]
    """Per-process sampling state, rank order."""
    lora: LoraState | None = None
    fingerprint: dict[str, Any] | None = None
    """What defines the run (:func:`run_fingerprint`), compared on resume; None before schema 3."""
    schema: int = field(default=SCHEMA_VERSION)

    def to_dict(self) -> dict[str, Any]:
        """Plain types for ``torch.save``, in this schema's layout (whatever schema the state was read from); tensors
        as they are (``asdict`` would deep-copy the engine's weights)."""
        return {"schema": SCHEMA_VERSION, "model_name_or_path": self.model_name_or_path,
                "rollout": self.rollout.to_dict(), "nan_steps": self.nan_steps, "ranks": [vars(r) for r in self.ranks],
                "lora": asdict(self.lora) if self.lora else None, "fingerprint": self.fingerprint}

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> RunState:
        """The run state of a whole Lightning checkpoint dict: :meth:`from_dict` of its ``"ggpo"`` entry, with the
        asynchronous backlog that schemas up to 3 kept in the DataModule's entry."""
        state = cls.from_dict(checkpoint[CHECKPOINT_KEY])
        if state.schema < 4:
            state.rollout.backlog = (checkpoint.get(LEGACY_DATA_KEY) or {}).get("async")
        return state

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RunState:
        """Any schema version's dict (up to 3 without the backlog: :meth:`from_checkpoint`); CheckpointError for a
        newer schema than this code reads."""
        schema = state.get("schema", 1)
        if schema > SCHEMA_VERSION:
            raise CheckpointError(f"the checkpoint has schema {schema}, newer than this ggpo-lightning reads "
                                  f"({SCHEMA_VERSION}); upgrade ggpo-lightning")
        # schema 1 before per-rank state: one process's state at the top level
        ranks = state.get("ranks") or [{k: state[k] for k in ("rng", "generated_samples")}]
        lora = state.get("lora")
        rollout = (RolloutState(**state["rollout"]) if schema >= 4 else
                   RolloutState(state["engine_version"], state["engine_state"]))
        return cls(model_name_or_path=state["model_name_or_path"], rollout=rollout, nan_steps=state["nan_steps"],
                   ranks=[RankState(**r) for r in ranks], lora=LoraState(**lora) if lora else None,
                   fingerprint=state.get("fingerprint"), schema=schema)


SETTINGS_ADDED = {"model.rollout.schedule": "sync"}
"""Fingerprint settings added after checkpoints were written without them, with the value those runs had (a
checkpoint from before ``model.rollout.schedule`` was fingerprinted ran the sync schedule)."""


def run_fingerprint(settings: dict[str, Any], data: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint's record of what defines its run: ``settings`` (objective, beta, k, sync_every, rollout
    schedule, prompts_per_step, model base; recipe key -> value) and ``data``, the training data's fingerprint
    (``PromptGroupDataModule.fingerprint``: source, bytes, rows, SHA-256 of the rows in order)."""
    return {"settings": dict(settings), "data": None if data is None else dict(data)}


def fingerprint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"key: checkpoint X, now Y"`` for each setting or data property that differs (empty: the same run)."""
    differences = []
    for part in ("settings", "data"):
        old, new = saved.get(part) or {}, current.get(part) or {}
        if part == "settings":  # a key added since: what a run saved without it had
            old, new = {**SETTINGS_ADDED, **old}, {**SETTINGS_ADDED, **new}
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                name = key if part == "settings" else f"training data {key}"
                differences.append(f"{name}: checkpoint {old.get(key)!r}, now {new.get(key)!r}")
    return differences


def check_fingerprint(state: RunState, current: dict[str, Any], mismatch_ok: bool) -> None:
    """The checkpoint's fingerprint against this run's (``current``, :func:`run_fingerprint`): differences are a
    ResumeError naming each, or with ``mismatch_ok`` (``--resume_mismatch_ok true``) a warning. A checkpoint from
    before fingerprints resumes with a warning that nothing was checked."""
    if state.fingerprint is None:
        log.warning("the checkpoint predates run fingerprints (schema %d): resuming without checking that the "
                    "settings and training data are the ones it was trained with", state.schema)
        return
    differences = fingerprint_differences(state.fingerprint, current)
    if not differences:
        return
    listed = "\n  ".join(differences)
    if not mismatch_ok:
        raise ResumeError(f"the checkpoint was written by a different run:\n  {listed}\nresume with the settings "
                          "and data it was trained with, or pass --resume_mismatch_ok true to continue anyway")
    log.warning("resuming a checkpoint of a different run (--resume_mismatch_ok):\n  %s", listed)


def current_rank_state(generated_samples: int) -> RankState:
    """This process's sampling RNG (torch and Python) and sample count."""
    return RankState({"torch": torch.get_rng_state(), "python": random.getstate()}, generated_samples)


def restore_rank_state(ranks: list[RankState]) -> int:
    """Restore this rank's sampling RNG from ``ranks`` (one per process of the run that saved them) and return
    its sample count, so that a resumed run draws what an uninterrupted one would.

    A checkpoint written by another number of processes resumes too (the weights are
    resharded by the strategy), but the per-rank sampling streams cannot be mapped: each
    rank keeps its fresh seed, rank 0 takes the whole sample count, and the run continues
    without repeating the uninterrupted one draw for draw.
    """
    rank, world_size = world()
    if len(ranks) == world_size:
        torch.set_rng_state(ranks[rank].rng["torch"])
        random.setstate(ranks[rank].rng["python"])
        return ranks[rank].generated_samples
    log.warning("the checkpoint was written by %d processes and resumes on %d: the per-rank sampling RNG "
                "starts fresh (the run continues, but not draw for draw as it would have)", len(ranks), world_size)
    return sum(r.generated_samples for r in ranks) if rank == 0 else 0


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A Lightning checkpoint file, or a sharded one (a folder of ``torch.distributed.checkpoint`` shards and
    Lightning's ``meta.pt``) consolidated into one dict in memory."""
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not (path / "meta.pt").is_file() or not (path / ".metadata").is_file():
        raise CheckpointError(f"{path} is a folder but not a sharded checkpoint (no .metadata and meta.pt)")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(path, Path(tmp) / "full.pt")
        checkpoint = torch.load(Path(tmp) / "full.pt", map_location="cpu", weights_only=True)
    return {**checkpoint, **torch.load(path / "meta.pt", map_location="cpu", weights_only=True)}


def learner_weights(checkpoint: dict[str, Any]) -> dict[str, Tensor]:
    """The learner's weights of a checkpoint (its ``learner.*`` entries, prefix removed)."""
    return {key.removeprefix("learner."): value for key, value in checkpoint.get("state_dict", {}).items()
            if key.startswith("learner.")}
