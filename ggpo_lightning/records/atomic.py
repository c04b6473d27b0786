"""Atomic file writes: readers see the old file or the complete new one, never a half-written one."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text", "fsync_directory", "fsync_file", "remove_orphans",
           "temporary_name"]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], binary: bool = False,
                before_replace: Callable[[Path], None] | None = None) -> Iterator[IO]:
    """Open a file for writing (UTF-8 text, or bytes) that replaces ``path`` only when the block ends cleanly.

    The text goes to a uniquely named temporary file in the same directory (``os.replace``
    is atomic only within one file system; never ``$TMPDIR``), is flushed and fsynced,
    renamed over ``path``, and the directory is fsynced (the rename survives a power
    loss). On any exception ``path`` is left as it was and the temporary file is removed;
    one left by a killed process is removed by :func:`remove_orphans`. Parent directories
    are created. ``before_replace(temporary path)`` runs once the content is on disk, just
    before the rename (a checksum of the complete content).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    # os.open with mode 0o666 honours the umask, like a plain open() would.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        text = {} if binary else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, "wb" if binary else "w", **text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def temporary_name(path: Path) -> Path:
    """A unique hidden name beside ``path`` that records the writing process: ``.NAME.PID.RANDOM.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def fsync_file(path: Path) -> None:
    """Flush ``path``'s content to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_directory(directory: Path) -> None:
    """Make a rename or creation inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_orphans(directory: Path) -> list[Path]:
    """Remove the temporary files and folders (:func:`temporary_name`) that killed processes left in ``directory``;
    those of live processes stay. Returns what was removed."""
    removed = []
    for entry in Path(directory).glob(".*.tmp"):
        parts = entry.name.rsplit(".", 3)  # [".NAME", PID, RANDOM, "tmp"]
        if len(parts) != 4 or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, binary=True) as f:
        f.write(data)
