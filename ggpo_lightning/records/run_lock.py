"""One run per run directory: ``.<run dir name>.lock`` beside it, held while ``ggpo-train`` runs.

Two runs writing into the same version directory would interleave ``metrics.csv`` and
overwrite each other's ``config.yaml``, checkpoints, ``summary.json`` and
``final_model/``. The lock is an ``flock`` on a file holding the holder's pid: the
kernel releases it when the holder exits, however it exits (``kill -9`` included), so a
stale lock file never blocks a later run. The lock file lies beside the run directory, not
in it: the directory is created empty (which reserves a logger's next ``version_N``) and
holds only what the run writes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from ggpo_lightning.records.errors import UserError

__all__ = ["RunDirectoryInUse", "lock_run_directory", "release_run_directory"]


class RunDirectoryInUse(UserError, RuntimeError):
    """Another live process holds the run directory's lock (a user's mistake: two runs into one directory)."""


def lock_run_directory(directory: Path) -> IO[str]:
    """Create ``directory`` and take its lock; keep the returned file open for as long as the run writes there.

    Raises:
        RunDirectoryInUse: another process holds it (the message names its pid).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory.parent / f".{directory.name}.lock"
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RunDirectoryInUse(
            f"run directory {directory} is in use by another ggpo-train (pid {holder}, lock {path}); wait for it to "
            "finish, or give this run another directory (trainer.logger.init_args.version or name)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def release_run_directory(handle: IO[str]) -> None:
    """Release the lock; remove the lock file, and the directory when nothing else is in it (a run that
    failed before writing anything)."""
    path = Path(handle.name)
    path.unlink(missing_ok=True)
    handle.close()
    directory = path.with_name(path.name[1:].removesuffix(".lock"))
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
