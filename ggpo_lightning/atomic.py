"""Atomic file writes: readers see the old file or the complete new one, never a half-written one."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text"]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO]:
    """Open a file for writing (UTF-8 text, or bytes) that replaces ``path`` only when the block ends cleanly.

    The text goes to a uniquely named temporary file in the same directory (``os.replace``
    is atomic only within one file system), is flushed and fsynced, then renamed over
    ``path``. On any exception ``path`` is left as it was and the temporary file is
    removed. Parent directories are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open with mode 0o666 honours the umask, like a plain open() would.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        text = {} if binary else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, "wb" if binary else "w", **text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, binary=True) as f:
        f.write(data)
