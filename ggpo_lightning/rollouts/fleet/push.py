"""A push's two ends on the trainer's side: the learner's weights as vLLM's transfer engines read them, and vLLM's
trainer-side transfer engine for one server (``nccl`` on GPUs, the package's ``ggpo_gloo`` elsewhere).

Imports vLLM only when a transfer engine is made, or a push's metadata read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ggpo_lightning.rollouts.fleet.launcher import free_ports

__all__ = ["PushedWeights", "transfer_engine"]


class PushedWeights:
    """The learner's weights as vLLM's transfer engines read them (a ``WeightSource``): ``(name, tensor)`` pairs in the
    serving dtype, materialised once per push (under FSDP the gathers are collectives) and replayed for every
    server."""

    def __init__(self, pairs: list[tuple[str, Tensor]]) -> None:
        self.pairs = pairs

    def metadata(self) -> list[Any]:
        """vLLM's ``ParamMeta`` of each tensor, in the order they are sent."""
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in self.pairs]

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self.pairs)

    def held_names(self) -> None:
        """None: every rank holds every tensor (vLLM's ``WeightSource`` asks, for sharded sources)."""
        return None


def transfer_engine(url: str, timeout: float) -> Any:
    """vLLM's trainer-side transfer engine for the server at ``url``: ``nccl`` on GPUs (vLLM's own; a group of
    this process and the server's worker), ``ggpo_gloo`` elsewhere (:mod:`~ggpo_lightning.rollouts.fleet.gloo_backend`).
    One group per server: a server that dies breaks its own group only."""
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from ggpo_lightning.rollouts.fleet import gloo_backend

    client = HTTPVLLMWeightSyncClient(url, timeout=timeout)
    address = _local_address(url)
    if torch.cuda.is_available():  # not run yet: no GPU session has had vLLM (docs/PERFORMANCE.md)
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(rank=0, master_address=address, master_port=free_ports(address, 1)[0],
                                   world_size=2)
    else:
        gloo_backend.register()
        info = gloo_backend.GlooTrainerInitInfo(rank=0, master_address=address, timeout_seconds=timeout)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=PushedWeights([]))


def _local_address(url: str) -> str:
    """This host's address as the server at ``url`` reaches it (loopback for a local server)."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # the interface that routes to the server
        probe.connect((host, 9))
        return probe.getsockname()[0]
