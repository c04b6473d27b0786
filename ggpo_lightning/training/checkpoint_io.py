"""Checkpoint files written atomically and read with a clear verdict: Lightning's ``CheckpointIO`` for ``ggpo-train``.

``ggpo-train`` puts :class:`AtomicCheckpointIO` in place of Lightning's default
``TorchCheckpointIO``: each checkpoint is written to a temporary file beside its target
(never in ``$TMPDIR``, which may be another file system), fsynced, renamed over the
target and the rename fsynced, so ``last.ckpt`` is always the previous complete
checkpoint or the new one, also after ``kill -9``; sharded checkpoints (folders) the same
way through :class:`AtomicModelParallelStrategy`. Temporary files of killed writers
are removed at the next save or load in that folder. Each checkpoint gets a SHA-256
sidecar (``NAME.sha256``, :mod:`~ggpo_lightning.records.integrity`) once it is in place,
verified before it loads: a checkpoint that is empty, truncated or damaged is named as
such, with the newest checkpoint beside it that verifies suggested. A full disk during a
save is a one-line :class:`~ggpo_lightning.records.errors.DiskFullError` (the path, the
space needed and free); the temporary file is removed and the previous checkpoint stays.
"""

from __future__ import annotations

import errno
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy

from ggpo_lightning.core.distributed import all_gather_objects
from ggpo_lightning.records.atomic import atomic_open, fsync_directory, fsync_file, remove_orphans, temporary_name
from ggpo_lightning.records.errors import CheckpointError, DiskFullError
from ggpo_lightning.records.integrity import (Integrity, check_checkpoint, checksums, raise_unusable, remove_sidecar,
                                              verify, write_sidecar)

__all__ = ["AtomicCheckpointIO", "AtomicModelParallelStrategy", "CheckpointError", "check_checkpoint",
           "disk_full_error"]

_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(exc: BaseException, path: Path, needed: int) -> DiskFullError | None:
    """A :class:`DiskFullError` for ``path`` when ``exc`` or an exception in its chain is "no space left" or
    "quota exceeded" (torch's writer wraps the ``OSError`` in a ``RuntimeError``); else None."""
    seen = exc
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in _FULL):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    free = shutil.disk_usage(path.parent).free if path.parent.is_dir() else 0
    return DiskFullError(f"no space left to save {path}: it needs about {_mb(needed)}, {_mb(free)} free on that "
                         "file system; free space (or point the run elsewhere) and resume from the previous "
                         "checkpoint")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the distinct tensor storages in a checkpoint dict: what its file needs, give or take the
    pickled structure."""
    seen: dict[int, int] = {}

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(obj)
    return sum(seen.values())


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic local saves and checked loads (module docstring). Remote paths
    (``s3://...``) go to Lightning's implementation unchanged."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_orphans(path.parent)
        digests: dict[str, str] = {}

        def seal(tmp: Path) -> None:  # the complete content's checksum; the old one goes before the rename
            digests.update(checksums(tmp))
            remove_sidecar(path)

        try:
            with atomic_open(path, binary=True, before_replace=seal) as f:
                torch.save(checkpoint, f)
            write_sidecar(path, digests)
        except (OSError, RuntimeError) as exc:
            full = disk_full_error(exc, path, _tensor_bytes(checkpoint))
            if full is None:
                raise
            raise full from exc

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        if "://" not in str(path):
            remove_sidecar(path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only)
        check_checkpoint(path)  # hashes only what the preflight did not verify
        try:
            return super().load_checkpoint(path, map_location, weights_only)
        except (EOFError, RuntimeError, zipfile.BadZipFile) as exc:  # a damaged body behind a valid directory
            raise_unusable(Path(path), f"is corrupt ({type(exc).__name__}: {exc})")



class AtomicModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` whose sharded checkpoints (folders of ``torch.distributed.checkpoint``
    shards and ``meta.pt``) are written into a temporary folder beside the target and renamed into place
    once every rank has written its shards. ``ggpo-train`` uses it in place of ``ModelParallelStrategy``.

    A folder cannot be renamed over a folder: the previous checkpoint is renamed aside first and removed
    after, so a kill between the two renames leaves both complete folders (the new one under its
    temporary name) and no torn one; :func:`check_checkpoint` then names the target as missing.

    Checksums per shard: after the shards are written each rank hashes its share of the folder's files, rank 0
    writes the sidecar once the folder is in place; a load verifies the same way, and the verdict is gathered
    so that every rank raises the same :class:`CheckpointError` (none is left waiting in a collective).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # one file, via AtomicCheckpointIO
        path = Path(self.broadcast(str(filepath)))
        tmp = Path(self.broadcast(str(temporary_name(path))))  # rank 0's name on every rank
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier("AtomicModelParallelStrategy.save_checkpoint")
        digests = {name: digest for share in all_gather_objects(checksums(tmp, self._my_share(tmp)))
                   for name, digest in share.items()}
        if self.global_rank == 0:
            fsync_file(tmp / "meta.pt")
            remove_sidecar(path)
            aside = temporary_name(path) if path.exists() else None
            if aside is not None:
                os.replace(path, aside)
            os.replace(tmp, path)
            fsync_directory(path.parent)
            if aside is not None and aside.is_dir():
                shutil.rmtree(aside)
            elif aside is not None:
                aside.unlink()
            write_sidecar(path, digests)
        self.barrier("AtomicModelParallelStrategy.save_checkpoint done")

    def _my_share(self, folder: Path) -> list[str]:
        """This rank's share of the files under ``folder`` (every world_size-th of the sorted names)."""
        names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        return names[self.global_rank::self.world_size]

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            verdict = verify(path, share=(self.global_rank, self.world_size))
            damage = [v.detail for v in all_gather_objects(verdict) if v.status is Integrity.MISMATCH]
            if damage:
                raise_unusable(path, f"is damaged: {damage[0]}")
        return super().load_checkpoint(path, weights_only)
