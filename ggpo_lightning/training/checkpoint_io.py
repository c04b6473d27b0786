"""Checkpoint files written atomically and read with a clear verdict: Lightning's ``CheckpointIO`` for ``ggpo-train``.

``ggpo-train`` puts :class:`AtomicCheckpointIO` in place of Lightning's default
``TorchCheckpointIO``: each checkpoint is written to a temporary file beside its target
(never in ``$TMPDIR``, which may be another file system), fsynced, renamed over the
target and the rename fsynced, so ``last.ckpt`` is always the previous complete
checkpoint or the new one, also after ``kill -9``; sharded checkpoints (folders) the same
way through :class:`AtomicModelParallelStrategy`. Temporary files of killed writers
are removed at the next save or load in that folder. A checkpoint that is empty or
truncated is named as such, with the newest loadable checkpoint beside it suggested.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import Any, NoReturn

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy

from ggpo_lightning.records.atomic import atomic_open, fsync_directory, fsync_file, remove_orphans, temporary_name

__all__ = ["AtomicCheckpointIO", "AtomicModelParallelStrategy", "CheckpointError", "check_checkpoint"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (missing, empty, truncated or corrupt)."""


def _problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None (cheap: no tensor is read)."""
    if not path.exists():
        return "does not exist"
    if path.is_dir():  # a sharded checkpoint: torch.distributed.checkpoint's .metadata and Lightning's meta.pt
        missing = [name for name in (".metadata", "meta.pt") if not (path / name).is_file()]
        return f"is an incomplete sharded checkpoint (no {', '.join(missing)})" if missing else None
    if path.stat().st_size == 0:
        return "is empty (0 bytes): its save was interrupted"
    if not zipfile.is_zipfile(path):
        return "is corrupt: not a complete torch checkpoint (truncated or overwritten)"
    return None


def _newest_loadable(directory: Path, but: Path) -> Path | None:
    candidates = [p for p in directory.glob("*.ckpt") if p.resolve() != but.resolve()]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        if _problem(candidate) is None:
            return candidate
    return None


def check_checkpoint(path: str | Path) -> None:
    """Raise :class:`CheckpointError` naming ``path`` and what is wrong with it, and suggesting the newest
    loadable checkpoint in its folder; also removes temporary files killed writers left there."""
    path = Path(path)
    if path.parent.is_dir():
        remove_orphans(path.parent)
    problem = _problem(path)
    if problem is not None:
        _raise(path, problem)


def _raise(path: Path, problem: str) -> NoReturn:
    other = _newest_loadable(path.parent, path) if path.parent.is_dir() else None
    hint = (f"resume from {other} (the newest loadable checkpoint there)" if other
            else "no other loadable checkpoint is in that folder; start the run afresh")
    raise CheckpointError(f"checkpoint {path} {problem}; {hint}")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic local saves and checked loads (module docstring). Remote paths
    (``s3://...``) go to Lightning's implementation unchanged."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_orphans(path.parent)
        with atomic_open(path, binary=True) as f:
            torch.save(checkpoint, f)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only)
        check_checkpoint(path)
        try:
            return super().load_checkpoint(path, map_location, weights_only)
        except (EOFError, RuntimeError, zipfile.BadZipFile) as exc:  # a damaged body behind a valid directory
            _raise(Path(path), f"is corrupt ({type(exc).__name__}: {exc})")


class AtomicModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` whose sharded checkpoints (folders of ``torch.distributed.checkpoint``
    shards and ``meta.pt``) are written into a temporary folder beside the target and renamed into place
    once every rank has written its shards. ``ggpo-train`` uses it in place of ``ModelParallelStrategy``.

    A folder cannot be renamed over a folder: the previous checkpoint is renamed aside first and removed
    after, so a kill between the two renames leaves both complete folders (the new one under its
    temporary name) and no torn one; :func:`check_checkpoint` then names the target as missing.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # one file, via AtomicCheckpointIO
        path = Path(self.broadcast(str(filepath)))
        tmp = Path(self.broadcast(str(temporary_name(path))))  # rank 0's name on every rank
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier("AtomicModelParallelStrategy.save_checkpoint")
        if self.global_rank == 0:
            fsync_file(tmp / "meta.pt")
            aside = temporary_name(path) if path.exists() else None
            if aside is not None:
                os.replace(path, aside)
            os.replace(tmp, path)
            fsync_directory(path.parent)
            if aside is not None and aside.is_dir():
                shutil.rmtree(aside)
            elif aside is not None:
                aside.unlink()
        self.barrier("AtomicModelParallelStrategy.save_checkpoint done")
