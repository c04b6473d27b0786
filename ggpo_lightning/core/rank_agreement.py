"""One outcome for every rank: what one rank decides or fails at, every rank learns before it moves on.

A run on several processes hangs when one rank raises and the others wait in the next collective (a gradient
all-reduce, a checkpoint save). Two shapes keep the ranks together:

- :func:`from_rank0`: rank 0 alone does the work (pushes to the rollout servers, takes a step's groups from the
  producer) and hands each rank its share; when the work raised, every rank raises instead.
- :func:`failing_together`: every rank does its own work (rolls out its share of a step); when any rank's raised,
  every rank raises.

What the others raise mirrors the failed rank's error (:func:`mirrored`): a deliberate stop
(:class:`~ggpo_lightning.records.errors.RunAborted`: every rollout server gone) stays one, with the same message and
status, so every rank saves its part of ``aborted.ckpt`` and ``ggpo-train`` prints the same one line on every
process; any other error (a bug) is a ``RuntimeError`` naming the rank and the error, so no rank starts the
collective save that the failed rank would not join. The failed rank raises its own error, traceback and all.

Every wait here is a collective: bounded by the process group's timeout (Lightning's default: 30 minutes;
``trainer.strategy``'s ``timeout``). Nothing happens, and nothing is sent, on one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch.distributed as dist

from ggpo_lightning.core.distributed import all_gather_objects, world
from ggpo_lightning.records.errors import RunAborted

__all__ = ["Failure", "failing_together", "from_rank0", "mirrored"]

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """What the other ranks learn of one rank's error: enough to raise its mirror (:func:`mirrored`)."""

    rank: int
    kind: str
    """The error's type name."""
    message: str
    status: str | None
    """``RunAborted.status`` for a deliberate stop, None for any other error."""

    @classmethod
    def of(cls, error: BaseException, rank: int) -> Failure:
        status = error.status if isinstance(error, RunAborted) else None
        return cls(rank, type(error).__name__, str(error), status)


def mirrored(failure: Failure) -> Exception:
    """The error a rank raises for another rank's ``failure``: a :class:`RunAborted` with its message and status for a
    deliberate stop, else a ``RuntimeError`` that names the rank and the error."""
    if failure.status is not None:
        stop = RunAborted(failure.message)
        stop.status = failure.status
        return stop
    first_line = failure.message.splitlines()[0][:300] if failure.message else ""
    return RuntimeError(f"rank {failure.rank} failed ({failure.kind}: {first_line}); this rank stops with it")


def from_rank0(shares: Callable[[], Sequence[T]]) -> T:
    """Rank 0 calls ``shares()`` (one item per rank, in rank order) and each rank returns its own item (one
    ``scatter_object_list``). When ``shares`` raises, every rank raises: rank 0 its error, the others its
    :func:`mirrored` one. On one process: ``shares()[0]``."""
    rank, world_size = world()
    if world_size == 1:
        return shares()[0]
    error: Exception | None = None
    sent: list[object] | None = None
    if rank == 0:
        try:
            sent = list(shares())
            if len(sent) != world_size:
                raise RuntimeError(f"from_rank0: {len(sent)} shares for {world_size} ranks")
        except Exception as failure:  # noqa: BLE001 - handed to every rank below, then raised here
            error = failure
            sent = [Failure.of(failure, 0)] * world_size
    received: list[object] = [None]
    dist.scatter_object_list(received, sent, src=0)
    if error is not None:
        raise error
    if isinstance(received[0], Failure):
        raise mirrored(received[0])
    return received[0]  # type: ignore[return-value]


@contextlib.contextmanager
def failing_together() -> Iterator[None]:
    """The block runs on every rank; when it raised on any, it raises on every rank (one ``all_gather_object``, also
    when nothing failed): the failed rank its own error, the others the first failed rank's :func:`mirrored` one. On
    one process: the block alone. A ``BaseException`` that is not an ``Exception`` (a second Ctrl-C) passes through
    unshared."""
    rank, world_size = world()
    if world_size == 1:
        yield
        return
    error: Exception | None = None
    try:
        yield
    except Exception as failure:  # noqa: BLE001 - shared below, then raised
        error = failure
    failures = [f for f in all_gather_objects(None if error is None else Failure.of(error, rank)) if f is not None]
    if error is not None:
        raise error
    if failures:
        raise mirrored(failures[0])
