"""One run per run directory: ``.<run dir name>.lock`` beside it, held while ``ggpo-train`` runs.

Two runs writing into the same version directory would interleave ``metrics.csv`` and
overwrite each other's ``config.yaml``, checkpoints, ``summary.json`` and
``final_model/``. The lock is a ``filelock.FileLock`` (an OS lock on the file: ``flock`` on
Unix, ``LockFileEx`` on Windows) on a file holding the holder's pid: the operating system
releases it when the holder exits, however it exits (``kill -9`` included), so a stale lock
file never blocks a later run. The lock file lies beside the run directory, not in it: the
directory is created empty (which reserves a logger's next ``version_N``) and holds only
what the run writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ggpo_lightning.records.errors import UserError

__all__ = ["RunDirectoryInUse", "RunLock", "lock_run_directory", "release_lock", "release_run_directory"]

START_FILES = ("config.yaml",)
"""What a run writes into its directory before its first step (LightningCLI's saved configuration): a run that
stops with nothing more written leaves no directory behind (:func:`release_run_directory`)."""


class RunDirectoryInUse(UserError, RuntimeError):
    """Another live process holds the run directory's lock (a user's mistake: two runs into one directory)."""


@dataclass
class RunLock:
    """The held lock of one run directory (:func:`lock_run_directory`)."""

    directory: Path
    """The run directory."""
    lock: FileLock
    """The lock on ``.<directory name>.lock`` beside it."""


def lock_run_directory(directory: Path) -> RunLock:
    """Create ``directory`` and take its lock; hold the returned lock for as long as the run writes there.

    Raises:
        RunDirectoryInUse: another process holds it (the message names its pid).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory.parent / f".{directory.name}.lock"
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = path.read_text(encoding="utf-8").strip() if path.is_file() else ""
        raise RunDirectoryInUse(
            f"run directory {directory} is in use by another ggpo-train (pid {holder or 'unknown'}, lock {path}); "
            "wait for it to finish, or give this run another directory (trainer.logger.init_args.version or "
            "name)") from None
    path.write_text(f"{os.getpid()}\n", encoding="utf-8")  # read by the next would-be holder's error
    return RunLock(directory, lock)


def release_lock(held: RunLock) -> None:
    """Release the lock and remove the lock file; leave the directory and what it holds as they are."""
    held.lock.release()
    Path(held.lock.lock_file).unlink(missing_ok=True)


def release_run_directory(held: RunLock) -> None:
    """Release the lock and remove the lock file; remove the directory too when the run wrote nothing in it but
    its :data:`START_FILES` (a run stopped before its first step: a refused resume, a failed start)."""
    release_lock(held)
    directory = held.directory
    if directory.is_dir() and {p.name for p in directory.iterdir()} <= set(START_FILES):
        for name in START_FILES:
            (directory / name).unlink(missing_ok=True)
        directory.rmdir()
