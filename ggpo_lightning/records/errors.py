"""The project's own error types: mistakes a user can fix. ``ggpo-train`` and ``ggpo`` print their message (the
recipe key, the file and line, the fix) without a traceback; any other exception is a bug and keeps its traceback.

Each is also the built-in type the check raised before these types existed (mostly ``ValueError``). Beside them,
:class:`RunAborted`: not a mistake but a deliberate stop of a run (a failing verifier, no usable rollout server)."""

from __future__ import annotations

__all__ = ["CheckpointError", "DataError", "DiskFullError", "FolderInUseError", "MissingFileError", "ResumeError",
           "RunAborted", "SettingsError", "UserError"]


class UserError(Exception):
    """A mistake in what the user gave (settings, data, a checkpoint, a resume): the message says what and how to
    fix it."""


class SettingsError(UserError, ValueError):
    """A recipe key or command-line setting is invalid (the message names the key)."""


class DataError(UserError, ValueError):
    """A data file or row is unusable (the message names the file and line)."""


class MissingFileError(DataError, FileNotFoundError):
    """A file or folder the settings name does not exist (also a ``FileNotFoundError``, as raised before)."""


class FolderInUseError(UserError, FileExistsError):
    """A folder the settings name to build into holds files the builder did not write (the message names the
    folder; also a ``FileExistsError``, as raised before)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be used: missing, truncated, corrupt, or of a newer schema (the message names the file)."""


class ResumeError(UserError, ValueError):
    """A checkpoint belongs to another run (the message lists the differences and the override)."""


class DiskFullError(UserError, OSError):
    """A save found no space left (or the quota spent): the message names the path, the space needed and the
    space free. Not a ValueError: nothing the user gave was wrong, but the user can fix it."""


class RunAborted(RuntimeError):
    """A deliberate stop, raised at the same point on every process: ``ggpo-train`` saves a checkpoint and a
    ``summary.json`` saying why, then exits non-zero."""

    status = "aborted"
