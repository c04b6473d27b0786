"""Prompt datasets and the DataModule that serves whole prompt groups from the behavior buffer.

The training dataloader is an endless stream; each item is one optimizer step's
``list[RolloutGroup]`` drawn from the :class:`~ggpo_lightning.records.buffer.BehaviorBuffer`:

- ``online``: before each draw, the step's fresh groups come from the rollout source
  (:class:`~ggpo_lightning.rollouts.source.RolloutSource`: rolled out now with the engine as last synced, or
  taken from those rolled out ahead with ``model.rollout.schedule: async``) and are added;
- ``offline``: the buffer is filled once, from a buffer file (``buffer_path``) or by
  rolling out the training prompts with the initial model, and never refreshed.

The DataModule keeps the prompts (their order: :meth:`PromptGroupDataModule.step_prompts`) and the buffer; rolling
out needs the models, which it does not know: the source's owner
(:class:`~ggpo_lightning.training.rollout_loop.RolloutLoop`) sets :attr:`PromptGroupDataModule.source` at ``setup``
and saves the prompt stream's position with the source's backlog (:meth:`PromptGroupDataModule.prompt_state`).
Everything runs in the main process (``num_workers=0``): the engine's model must not be copied into worker
processes.

On several processes (DDP, FSDP) ``prompts_per_step`` counts the whole step: every rank
walks the same prompt order and trains on every ``world``-th prompt's group of each step from its
rank on (``distributed.rank_share``; the rollout source rolls them out on that rank, or on rank 0
for every rank with the async schedule), so ranks see disjoint prompts, each group (all K
responses) stays whole on one rank, and each rank keeps its own buffer. A
buffer file is split the same way; an offline fill is gathered back, in the order one
process would have written it, into one ``behavior_buffer.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from ggpo_lightning.core.distributed import all_gather_objects, interleave, rank_share, world
from ggpo_lightning.records.buffer import BehaviorBuffer, RolloutGroup
from ggpo_lightning.records.errors import DataError, MissingFileError, SettingsError
from ggpo_lightning.records.formats import FORMATS
from ggpo_lightning.records.prompts import PromptRow, load_dataset_rows, load_prompt_rows
from ggpo_lightning.rollouts.group import RolloutCounts
from ggpo_lightning.rollouts.source import RolloutBatch, RolloutSource

__all__ = ["PromptGroupDataModule", "TrainingBatch"]

MODES = ("online", "offline")


@dataclass
class TrainingBatch:
    """One optimizer step's data on this rank: the groups to train on and the rollout that fed the buffer for it."""

    groups: list[RolloutGroup]
    """Drawn from the behavior buffer (this rank's share of the step)."""
    rollout: RolloutBatch
    """What was rolled out before the draw, with its cost (empty once offline data is filled)."""


class _Once(IterableDataset):
    """One batch, ``items`` whole, on every rank (no distributed sampler splits an iterable dataset):
    the module's evaluation splits prompts across ranks itself."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self) -> Iterator[list]:
        yield self.items


class _GroupStream(IterableDataset):
    """Endless stream of training batches, each one step's list of prompt groups."""

    def __init__(self, datamodule: PromptGroupDataModule) -> None:
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[TrainingBatch]:
        while True:
            yield self.datamodule.next_batch()


def _identity(batch: Any) -> Any:
    return batch


class PromptGroupDataModule(L.LightningDataModule):
    """Prompts in, whole prompt groups out.

    Args:
        train_path: training prompts (JSONL or Parquet); or give ``dataset``.
        val_path: held-out prompts for accuracy (JSONL or Parquet); None = no validation.
        dataset: a ``datasets`` dataset (hub name or local path) instead of files.
        dataset_config: the dataset's configuration name, if it has several.
        train_split: ``dataset``'s split for training.
        val_split: ``dataset``'s split for held-out accuracy; None = no validation.
        format: the rows' layout (``prompt-answer``, ``math``, ``gsm8k``, ``verl``:
            :mod:`~ggpo_lightning.records.formats`); the gold is extracted from a worked solution once, at loading.
        prompt_field: ``prompt-answer`` layout: record field with the problem text.
        answer_field: ``prompt-answer`` layout: record field with the gold answer.
        id_field: record field with a stable id (missing ids become ``file:line``).
        prompt_template: Python format string over the record's fields, e.g.
            ``"Problem: {prompt}\\nAnswer:"``.
        mode: ``online`` (roll out fresh groups every step) or ``offline`` (fill once).
        prompts_per_step: prompt groups in one optimizer step.
        buffer_path: offline mode: a buffer JSONL file to train on (no generation at all).
        offline_prompts: offline mode without ``buffer_path``: how many training prompts
            to roll out once (None = all); the result is saved as ``behavior_buffer.jsonl``
            in the run directory, ready to be a later run's ``buffer_path``.
        buffer_draw: draw policy (``fifo``, ``newest``, ``uniform``); None = ``fifo``
            online (each fresh group used once), ``uniform`` offline (replay).
        buffer_capacity: most groups kept (oldest evicted first); None = unbounded.
        buffer_max_staleness: drop buffered groups whose staleness (learner step - behavior version) is above
            this when drawn, counted in the buffer's stats; None = no limit. (``model.rollout.max_staleness`` is
            another thing: the async schedule's bound.) Was ``max_staleness``.
        val_size: use only the first N held-out prompts; None = all.
        seed: seed of the prompt order and of buffer draws.
    """

    def __init__(
        self,
        train_path: str | None = None,
        val_path: str | None = None,
        dataset: str | None = None,
        dataset_config: str | None = None,
        train_split: str = "train",
        val_split: str | None = "test",
        format: str = "prompt-answer",
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        id_field: str | None = "id",
        prompt_template: str = "{prompt}",
        mode: str = "online",
        prompts_per_step: int = 8,
        buffer_path: str | None = None,
        offline_prompts: int | None = None,
        buffer_draw: str | None = None,
        buffer_capacity: int | None = None,
        buffer_max_staleness: int | None = None,
        val_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        errors = []
        if (train_path is None) == (dataset is None):
            errors.append("give exactly one of data.train_path (a JSONL/Parquet file) and data.dataset "
                          f"(a datasets name), got train_path={train_path!r}, dataset={dataset!r}")
        if dataset is not None and val_path is not None:
            errors.append("data.val_path goes with data.train_path; with data.dataset use data.val_split")
        if format not in FORMATS:
            errors.append(f"data.format must be one of {', '.join(FORMATS)}, got {format!r}")
        if mode not in MODES:
            errors.append(f"data.mode must be one of {MODES}, got {mode!r}")
        if prompts_per_step < 1:
            errors.append(f"data.prompts_per_step must be >= 1, got {prompts_per_step}")
        if buffer_path is not None and mode != "offline":
            errors.append("data.buffer_path is for offline mode; set data.mode: offline or drop buffer_path")
        if offline_prompts is not None and offline_prompts < 1:
            errors.append(f"data.offline_prompts must be >= 1, got {offline_prompts}")
        if errors:
            raise SettingsError("invalid data settings:\n  " + "\n  ".join(errors))
        self.train_path, self.val_path = train_path, val_path
        self.dataset = dict(name=dataset, config_name=dataset_config, train_split=train_split, val_split=val_split)
        self.fields = dict(prompt_field=prompt_field, answer_field=answer_field, id_field=id_field,
                           template=prompt_template, format=format)
        self.mode = mode
        self.prompts_per_step = prompts_per_step
        self.buffer_path = buffer_path
        self.offline_prompts = offline_prompts
        self.val_size = val_size
        self.seed = seed
        draw = buffer_draw or ("fifo" if mode == "online" else "uniform")
        self.buffer = BehaviorBuffer(capacity=buffer_capacity, draw=draw, max_staleness=buffer_max_staleness,
                                     seed=seed)
        self.train_rows: list[PromptRow] = []
        self.val_rows: list[PromptRow] = []
        self._order: list[int] = []  # prompt order of the current pass
        self._cursor = 0
        self._epoch = 0
        self._filled = False
        self.source: RolloutSource | None = None
        """Where the step's fresh groups come from (the module's rollout engine, verifier and schedule), taking its
        prompts from :meth:`step_prompts`; set by :class:`~ggpo_lightning.training.rollout_loop.RolloutLoop`."""

    # ------------------------------------------------------------------ Lightning hooks

    def setup(self, stage: str) -> None:
        _, world_size = world()
        if self.prompts_per_step % world_size:
            raise SettingsError(f"data.prompts_per_step ({self.prompts_per_step}) must be a multiple of the number of "
                                f"processes ({world_size}): each rank trains on an equal share of the step's groups")
        self.load_rows()

    def load_rows(self) -> None:
        """Read the training and held-out prompts (once); errors name ``file:line``
        (:mod:`~ggpo_lightning.records.prompts`).

        ``ggpo-train`` calls it before any model loads (:mod:`~ggpo_lightning.training.preflight`)."""
        if self.train_path is not None and not Path(self.train_path).is_file():
            raise MissingFileError(f"data.train_path {self.train_path} does not exist; check the path (or, for the "
                                   "synthetic task, set synthetic_data to generate it there)")
        if self.val_path is not None and not Path(self.val_path).is_file():
            raise DataError(f"data.val_path {self.val_path} does not exist; give the held-out prompt file, or "
                            "--data.val_path null for no held-out accuracy")
        if self.buffer_path is not None and not Path(self.buffer_path).is_file():
            raise MissingFileError(f"data.buffer_path {self.buffer_path} does not exist; give a behavior buffer "
                                   "JSONL file (a run's behavior_buffer.jsonl)")
        if not self.train_rows:
            self.train_rows = self._load(self.train_path, self.dataset["train_split"])
        if not self.val_rows:
            val = self._load(self.val_path, self.dataset["val_split"])
            self.val_rows = val[: self.val_size]

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the training data for a resume check: source, size in bytes (files), row count and
        a SHA-256 of the rows in file order (ids, prompts and golds). Needs :meth:`load_rows` first."""
        digest = hashlib.sha256()
        for row in self.train_rows:
            digest.update(json.dumps([row.id, row.prompt, row.gold]).encode())
        if self.train_path is not None:
            source, size = str(Path(self.train_path).resolve()), Path(self.train_path).stat().st_size
        else:
            source, size = f"{self.dataset['name']}[{self.dataset['train_split']}]", None
        return {"train": source, "bytes": size, "rows": len(self.train_rows), "order_sha256": digest.hexdigest()}

    def _load(self, path: str | None, split: str | None) -> list[PromptRow]:
        name = self.dataset["name"]
        if name is None:
            return load_prompt_rows(path, **self.fields) if path else []
        if split is None:
            return []
        return load_dataset_rows(name, split, self.dataset["config_name"], **self.fields)

    def train_dataloader(self) -> DataLoader:
        # The stream must run in this process: it drives the rollout engine's model.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        # A private generator: DataLoader draws a base seed from it at every iter(), which would
        # otherwise shift the global RNG of rollout sampling (and break exact resumption).
        return DataLoader(_GroupStream(self), batch_size=None, num_workers=0, collate_fn=_identity,
                          generator=torch.Generator())

    def val_dataloader(self) -> DataLoader | list:
        if not self.val_rows:
            return []
        # its own generator, as the training stream's: iter() would otherwise draw a base seed from the global
        # RNG, so two runs differing only in val_check_interval would sample different rollouts
        return DataLoader(_Once(self.val_rows), batch_size=None, num_workers=0, collate_fn=_identity,
                          generator=torch.Generator())

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        # Batches are lists of RolloutGroup / PromptRow (Python objects); the module builds device tensors.
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The buffers and whether the offline fill ran. The prompt stream's position is saved with the rollout
        source's backlog (:meth:`prompt_state`): the source may take prompts while the learner trains."""
        # Called on every rank; Lightning saves rank 0's: each rank's buffer is gathered into it.
        return {"buffers": all_gather_objects(self.buffer.state_dict()), "filled": self._filled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(self._my_buffer_state(state.get("buffers") or [state["buffer"]]))
        self._filled = state["filled"]
        if "order" in state:  # a checkpoint up to schema 3: the prompt stream's position was kept here
            self.load_prompt_state(state)

    def prompt_state(self) -> dict[str, Any]:
        """Where the prompt stream stands: the current pass's order, the position in it and the pass number. Read it
        with the rollout source's backlog, under ``RolloutSource.prompts_frozen``."""
        return {"order": list(self._order), "cursor": self._cursor, "epoch": self._epoch}

    def load_prompt_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`prompt_state`; a pass over other training data than the saved one starts anew."""
        self._order, self._cursor, self._epoch = list(state["order"]), state["cursor"], state["epoch"]
        if self._order and (len(self._order) != len(self.train_rows)):
            # other training data (a resume with resume_mismatch_ok): the saved pass does not index it
            warnings.warn(f"the checkpoint's prompt order covers {len(self._order)} prompts, the training data has "
                          f"{len(self.train_rows)}: a new pass over the data starts", stacklevel=2)
            self._order, self._cursor = [], 0

    @staticmethod
    def _my_buffer_state(buffers: list[dict[str, Any]]) -> dict[str, Any]:
        """This rank's saved buffer; saved by another number of processes, all groups back in one order
        (oldest first, as one process would hold them) and split anew."""
        rank, world_size = world()
        if len(buffers) == world_size:
            return buffers[rank]
        groups = interleave([b["groups"] for b in buffers])
        return {**buffers[0], "groups": rank_share(groups, rank, world_size), "pass": []}

    # ------------------------------------------------------------------ the data path

    def next_prompts(self, n: int) -> list[PromptRow]:
        """The next ``n`` training prompts: passes over a seeded shuffle, reshuffled per pass."""
        rows = []
        while len(rows) < n:
            if self._cursor >= len(self._order):
                self._order = list(range(len(self.train_rows)))
                random.Random(self.seed * 1_000_003 + self._epoch).shuffle(self._order)
                self._epoch += 1
                self._cursor = 0
            rows.append(self.train_rows[self._order[self._cursor]])
            self._cursor += 1
        return rows

    def step_prompts(self) -> list[PromptRow]:
        """The next step's prompts, every rank's (the rollout source decides which rank rolls out which:
        :mod:`~ggpo_lightning.rollouts.source`)."""
        return self.next_prompts(self.prompts_per_step)

    def next_batch(self) -> TrainingBatch:
        """This rank's share of one optimizer step's prompt groups, after adding the fresh ones (online), or filling
        the buffer once (offline)."""
        if self.source is None:
            raise RuntimeError("PromptGroupDataModule has no rollout source: GGPOModule's RolloutLoop callback sets "
                               "one at setup")
        _, world_size = world()
        step = self.trainer.global_step
        if self.mode == "online":
            rollout = self.source.next_batch(step)
        elif not self._filled:
            rollout = self._fill_offline()
            self._filled = True  # only once the fill succeeded: a failed one is retried on resume
        else:
            rollout = RolloutBatch([], RolloutCounts())
        self.buffer.add(rollout.groups)
        groups = self.buffer.draw(self.prompts_per_step // world_size, current_version=step)
        if not groups:
            raise RuntimeError(
                f"the behavior buffer has no groups to draw (size {len(self.buffer)}, draw "
                f"{self.buffer.draw_policy!r}); with data.buffer_max_staleness set, groups may all be too stale"
            )
        return TrainingBatch(groups, rollout)

    def _fill_offline(self) -> RolloutBatch:
        """The buffer file's groups (this rank's share), or the training prompts rolled out once with the initial
        model, saved as ``behavior_buffer.jsonl`` (their rollout is returned for its metrics; the groups are
        added by the caller)."""
        rank, world_size = world()
        if self.buffer_path is not None:
            return RolloutBatch(rank_share(BehaviorBuffer.load_jsonl(self.buffer_path).groups(), rank, world_size))
        count = self.offline_prompts or len(self.train_rows)
        rollout = self.source.roll_out(rank_share(self.next_prompts(count), rank, world_size),
                                       per_call=self.prompts_per_step // world_size)
        self._save_offline_data(rollout.groups)
        return rollout

    def _save_offline_data(self, generated: list[RolloutGroup]) -> None:
        """The generated data set, reusable as data.buffer_path (same data, no generation): every rank's
        groups, interleaved back into the prompt order, in one file written by rank 0."""
        groups = interleave(all_gather_objects(generated))  # the objects themselves on one process
        # on every rank: trainer.log_dir is itself a collective (a broadcast from rank 0)
        path = Path(self.trainer.log_dir or self.trainer.default_root_dir) / "behavior_buffer.jsonl"
        if not self.trainer.is_global_zero:
            return
        merged = BehaviorBuffer()
        merged.add(groups)
        merged.save_jsonl(path)
        print(f"offline behavior data ({len(merged)} groups) saved to {path}", flush=True)
