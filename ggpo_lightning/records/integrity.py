"""Checksums of checkpoints and exports: a SHA-256 sidecar beside each, verified before anything is loaded from it.

torch's zip reader does not verify its records' CRCs, so a bit flipped by a bad disk or a
network file system loads silently. Each checkpoint file ``NAME`` (or sharded checkpoint /
export folder ``NAME/``) gets a sidecar ``NAME.sha256`` in ``sha256sum`` format, one line
per file (``<hex>  NAME`` or ``<hex>  NAME/<relative path>``), so ``sha256sum -c NAME.sha256``
in the parent folder checks it with standard tools too.

Order of a save (:func:`~ggpo_lightning.records.atomic.atomic_open`): the new content is
written and fsynced under a temporary name and hashed; the old sidecar is removed; the
content is renamed into place; the new sidecar is written atomically. A kill at any point
leaves a file whose sidecar matches it, or a file without a sidecar (*unverified*: it
loads with a warning, as checkpoints written before checksums do), never a false
mismatch. SHA-256 runs at about 1.5 GB/s on one core with SHA extensions (docs/running.md
states the measured figure). :func:`check_checkpoint` is the verdict on a checkpoint to
resume from (structure, then checksum; on failure the newest one beside it that verifies
is named). Torch-free.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ggpo_lightning.records.atomic import atomic_write_text, remove_orphans
from ggpo_lightning.records.errors import CheckpointError

__all__ = ["SIDECAR_SUFFIX", "Integrity", "Verdict", "check_checkpoint", "check_intact", "checksums", "file_sha256",
           "raise_unusable", "recorded", "remove_sidecar", "sidecar", "verify", "write_sidecar"]

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".sha256"
_CHUNK = 8 << 20  # 8 MiB reads: large enough that the hash, not the call overhead, sets the speed


class Integrity(enum.Enum):
    VERIFIED = "verified"
    """Every file matches its sidecar line."""
    UNVERIFIED = "unverified"
    """No sidecar (written before checksums, by another tool, or killed between the rename and the sidecar)."""
    MISMATCH = "mismatch"
    """A file differs from its recorded checksum, or a recorded file is missing: the content is damaged."""


@dataclass(frozen=True)
class Verdict:
    status: Integrity
    detail: str = ""
    """For a mismatch: which file and how (for the error message)."""


def sidecar(path: str | os.PathLike[str]) -> Path:
    """The checksum file of the checkpoint or folder ``path``: ``path`` + ``.sha256``, beside it."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, as hex (read in 8 MiB chunks; one core)."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def _files(path: Path) -> list[str]:
    """The files a sidecar of ``path`` lists, relative to ``path`` ('' for a file), sorted."""
    if path.is_file():
        return [""]
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def checksums(path: str | os.PathLike[str], only: Iterable[str] | None = None) -> dict[str, str]:
    """``{relative name: sha256}`` of the file ``path`` (key ``''``) or of every file under the folder ``path``;
    ``only`` restricts it to those names (a rank's share of a sharded checkpoint)."""
    path = Path(path)
    names = _files(path) if only is None else list(only)
    return {name: file_sha256(path / name if name else path) for name in names}


def write_sidecar(path: str | os.PathLike[str], digests: dict[str, str]) -> Path:
    """Write ``path``'s sidecar atomically from ``digests`` (:func:`checksums`, possibly computed under a
    temporary name: the lines name ``path``)."""
    path = Path(path)
    name = path.name
    lines = [f"{digest}  {name}/{rel}" if rel else f"{digest}  {name}" for rel, digest in sorted(digests.items())]
    target = sidecar(path)
    atomic_write_text(target, "\n".join(lines) + "\n")
    return target


def remove_sidecar(path: str | os.PathLike[str]) -> None:
    """Remove ``path``'s sidecar (before its content is replaced or removed): a missing one reads as
    unverified, a stale one would read as damage."""
    sidecar(path).unlink(missing_ok=True)


def recorded(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The sidecar's ``{relative name: sha256}``, or None when ``path`` has no sidecar."""
    path = Path(path)
    try:
        text = sidecar(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    entries = {}
    for line in text.splitlines():  # "<hex>  NAME" or "<hex>  NAME/RELATIVE"; NAME may be a renamed copy's
        digest, _, name = line.partition("  ")
        entries[name.partition("/")[2]] = digest.strip()
    return entries


def verify(path: str | os.PathLike[str], share: tuple[int, int] = (0, 1)) -> Verdict:
    """Check ``path`` (a file or a folder) against its sidecar.

    ``share = (rank, world_size)`` checks only every ``world_size``-th recorded file from
    ``rank`` on (ranks of a sharded load split the hashing; their verdicts are combined by
    the caller). Files added to a folder after its sidecar was written are not checked.
    """
    path = Path(path)
    expected = recorded(path)
    if expected is None:
        return Verdict(Integrity.UNVERIFIED, f"{path} has no checksum file ({sidecar(path).name})")
    rank, world_size = share
    for rel in sorted(expected)[rank::world_size]:
        target = path / rel if rel else path
        if not target.is_file():
            return Verdict(Integrity.MISMATCH, f"{target} is missing (listed in {sidecar(path).name})")
        if file_sha256(target) != expected[rel]:
            return Verdict(Integrity.MISMATCH, f"{target} does not match its checksum in {sidecar(path).name}")
    return Verdict(Integrity.VERIFIED)


def check_intact(path: str | os.PathLike[str], what: str = "export") -> Verdict:
    """Verify ``path`` against its sidecar: a mismatch is a :class:`CheckpointError` naming the file, a missing
    sidecar a warning (``what`` names the kind of file in it); returns the verdict."""
    verdict = verify(path)
    if verdict.status is Integrity.MISMATCH:
        raise CheckpointError(f"{what} {path} is damaged: {verdict.detail} (bit rot, a bad disk or an "
                              "interrupted copy); restore it from a good copy")
    if verdict.status is Integrity.UNVERIFIED:
        log.warning("%s %s is not verified: it has no checksum file %s (written before checksums, or by another "
                    "tool)", what, path, sidecar(path).name)
    return verdict


# ----------------------------------------------------------------------------- checkpoints


def _problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None (cheap: no tensor is read, no byte hashed)."""
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


def _newest_loadable(directory: Path, but: Path) -> tuple[Path, bool] | None:
    """The newest checkpoint in ``directory`` other than ``but`` that verifies against its sidecar, ``(path,
    True)``; else the newest complete one without a sidecar, ``(path, False)``; else None. A mismatching one
    never counts."""
    candidates = sorted((p for p in directory.glob("*.ckpt") if p.resolve() != but.resolve()),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    unverified = None
    for candidate in candidates:
        if _problem(candidate) is not None:
            continue
        status = verify(candidate).status
        if status is Integrity.VERIFIED:
            return candidate, True
        if status is Integrity.UNVERIFIED and unverified is None:
            unverified = candidate
    return None if unverified is None else (unverified, False)


_verified: set[tuple[str, int, int]] = set()
"""Checkpoint files this process verified (path, size, mtime): the preflight's verdict stands at the load that
follows (hashing a large file twice costs a second per GB)."""


def check_checkpoint(path: str | os.PathLike[str], content: bool = True) -> Verdict:
    """Raise :class:`CheckpointError` naming ``path`` and what is wrong with it (missing, empty, truncated, or
    not matching its checksum) and the newest checkpoint in its folder that verifies; a checkpoint without a
    sidecar passes with a warning (unverified). Also removes temporary files killed writers left there.

    ``content=False`` checks the structure only (no byte hashed): a sharded checkpoint loaded by several
    processes is verified by them, a share of the shards each (the strategy's load)."""
    path = Path(path)
    if path.parent.is_dir():
        remove_orphans(path.parent)
    problem = _problem(path)
    if problem is not None:
        raise_unusable(path, problem)
    if not content:
        return Verdict(Integrity.UNVERIFIED, "not hashed here")
    key = (str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) if path.is_file() else None
    if key in _verified:
        return Verdict(Integrity.VERIFIED)
    verdict = verify(path)
    if key is not None and verdict.status is Integrity.VERIFIED:
        _verified.add(key)
    if verdict.status is Integrity.MISMATCH:
        raise_unusable(path, f"is damaged: {verdict.detail}")
    if verdict.status is Integrity.UNVERIFIED:
        log.warning("checkpoint %s is not verified: it has no checksum file %s (written before checksums, or "
                    "killed between its rename and its checksum); loading it anyway", path, sidecar(path).name)
    return verdict


def raise_unusable(path: Path, problem: str) -> NoReturn:
    """Raise :class:`CheckpointError`: ``checkpoint PATH PROBLEM; resume from <the newest that verifies>``."""
    found = _newest_loadable(path.parent, path) if path.parent.is_dir() else None
    if found is None:
        hint = "no other loadable checkpoint is in that folder; start the run afresh"
    elif found[1]:
        hint = f"resume from {found[0]} (the newest checkpoint there that verifies)"
    else:
        hint = (f"resume from {found[0]} (the newest loadable one there; unverified: it has no checksum file, "
                "and none there verifies)")
    raise CheckpointError(f"checkpoint {path} {problem}; {hint}")
