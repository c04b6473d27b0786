"""Two real processes joined by a gloo process group, for tests of the cross-rank reductions (CPU, seconds). A
collective that one rank never joins fails after :data:`COLLECTIVE_SECONDS` (gloo's timeout) instead of hanging."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


COLLECTIVE_SECONDS = 60


def _worker(rank: int, port: int, fn: Callable[[int], Any], out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=COLLECTIVE_SECONDS))
    try:
        out[rank] = fn(rank)
    finally:
        dist.destroy_process_group()


def on_two_ranks(fn: Callable[[int], Any]) -> list[Any]:
    """``[fn(0), fn(1)]``, each called in its own process of a 2-rank gloo group (``fn`` must be picklable: a
    module-level function or a ``functools.partial`` of one; its result too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").Manager().dict()  # forked, it would keep the test's sockets open (a killed server)
    mp.spawn(_worker, args=(port, fn, out), nprocs=2, join=True)
    return [out[0], out[1]]
