"""A push's two ends on the trainer's side: the learner's weights as vLLM's transfer engines read them, streamed, and
vLLM's trainer-side transfer engine for one server (``nccl`` on GPUs, the package's ``ggpo_gloo`` elsewhere), driven
for every server of a push in one pass (:class:`SharedPass`).

Imports vLLM only when a transfer engine is made, or a push's metadata read.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ggpo_lightning.rollouts.fleet.launcher import free_ports

__all__ = ["SharedPass", "StreamedWeights", "send_together", "transfer_engine"]

class StreamedWeights:
    """The learner's weights as vLLM's transfer engines read them (a ``WeightSource``), produced as they are sent.

    :meth:`metadata` (names, global shapes, the serving dtype) reads no data and gathers nothing. Each pass
    (``iter``) yields ``(name, tensor)`` in the serving dtype one at a time: a sharded tensor (FSDP's ``DTensor``) is
    gathered (``full_tensor``, a collective every rank runs in the same order) and cast only when the pass reaches
    it, and nothing of it is kept once the consumer moves on. A model or a state dict is replayed at each pass; a
    one-shot stream of pairs is copied once, in the serving dtype, so that it can be replayed too.
    """

    def __init__(self, entries: Sequence[tuple[str, Tensor]], dtype: torch.dtype) -> None:
        self.entries = list(entries)  # references to the learner's tensors (sharded or not): no copy
        self.dtype = dtype

    @classmethod
    def of(cls, weights: nn.Module | Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
           dtype: torch.dtype) -> StreamedWeights:
        """The source of ``weights`` (a model, a state dict, or a stream of pairs) in ``dtype``."""
        if isinstance(weights, nn.Module):
            return cls(list(weights.state_dict().items()), dtype)
        if isinstance(weights, Mapping):
            return cls(list(weights.items()), dtype)
        return cls([(name, tensor.detach().to(dtype)) for name, tensor in weights], dtype)

    @property
    def collective(self) -> bool:
        """A pass gathers shards: every trainer rank must run it, as many times as rank 0 does."""
        return any(callable(getattr(tensor, "full_tensor", None)) for _, tensor in self.entries)

    @property
    def nbytes(self) -> int:
        """Bytes of one pass in the serving dtype."""
        return sum(tensor.numel() for _, tensor in self.entries) * self.dtype.itemsize

    def metadata(self) -> list[Any]:
        """vLLM's ``ParamMeta`` of each tensor, in the order a pass yields them."""
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, self.dtype, tuple(tensor.shape)) for name, tensor in self.entries]

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in self.entries:
            full = tensor.detach()
            if callable(getattr(full, "full_tensor", None)):  # vLLM's materialize_full_tensor, without importing vLLM
                full = full.full_tensor()
            yield name, full.to(self.dtype)

    def held_names(self) -> None:
        """None: every rank yields every tensor (vLLM's ``WeightSource`` asks, for sources split across ranks)."""
        return None

    def take_part_in_gathers(self) -> None:
        """One pass that keeps nothing: what the trainer ranks that do not push run while rank 0 pushes a sharded
        model (its gathers are collectives); a no-op for weights every rank holds whole."""
        if self.collective:
            for _ in self:
                pass


def transfer_engine(url: str, timeout: float, bucket_bytes: int | None = None) -> Any:
    """vLLM's trainer-side transfer engine for the server at ``url``: ``nccl`` on GPUs (vLLM's own, packed in buckets
    of ``bucket_bytes``; a group of this process and the server's worker), ``ggpo_gloo`` elsewhere
    (:mod:`~ggpo_lightning.rollouts.fleet.gloo_backend`; ``bucket_bytes`` per packed bucket, 0: one tensor at a time).
    None: the backend's default bucket. One group per server: a server that dies breaks its own group only."""
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from ggpo_lightning.rollouts.fleet import gloo_backend

    client = HTTPVLLMWeightSyncClient(url, timeout=timeout)
    address = _local_address(url)
    if torch.cuda.is_available():  # not run yet: no GPU session has had vLLM (docs/PERFORMANCE.md)
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(rank=0, master_address=address, master_port=free_ports(address, 1)[0],
                                   world_size=2,
                                   packed_buffer_size_bytes=bucket_bytes or gloo_backend.DEFAULT_BUCKET_BYTES)
    else:
        gloo_backend.register()
        info = gloo_backend.GlooTrainerInitInfo(rank=0, master_address=address, timeout_seconds=timeout)
        if bucket_bytes is not None:
            info.bucket_bytes = bucket_bytes
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=StreamedWeights([], torch.float32))


def send_together(transfers: Sequence[Any], source: StreamedWeights, timeout: float) -> list[BaseException | None]:
    """One pass of ``source`` into every transfer engine of ``transfers`` at once; per transfer, the error that
    stopped it (None: its server took the weights). ``ggpo_gloo`` engines share the packing (each bucket gathered,
    cast and packed once, broadcast on every server's group at once); other engines (vLLM's ``nccl``) each run their
    own ``send_weights`` in a thread, fed by one pass (:class:`SharedPass`). A failed transfer never stops the
    others; the pass always runs to its end (the other trainer ranks are in its gathers)."""
    if not transfers:
        source.take_part_in_gathers()
        return []
    gloo_backend = sys.modules.get("ggpo_lightning.rollouts.fleet.gloo_backend")  # imported with its engines (vLLM)
    if gloo_backend is not None and all(isinstance(t, gloo_backend.GlooTrainerEngine) for t in transfers):
        return gloo_backend.send_together(list(transfers), source)
    return SharedPass(source, len(transfers), timeout).run(list(transfers))


class SharedPass:
    """One pass of a source fed to several consumers at once, each through a view of its own (a ``WeightSource``
    with the source's metadata) read in its own thread: a tensor is produced once and handed to every view, at most
    ``depth`` ahead of the slowest live consumer. A consumer that fails stops taking; the others go on, and the
    pass runs to its end."""

    def __init__(self, source: StreamedWeights, consumers: int, timeout: float, depth: int = 2) -> None:
        self.source, self.timeout = source, timeout
        self.queues: list[queue.Queue] = [queue.Queue(depth) for _ in range(consumers)]
        self.live = [True] * consumers

    def run(self, transfers: list[Any]) -> list[BaseException | None]:
        """Each transfer's ``send_weights`` on its view, in its own thread, while this thread produces the pass."""
        errors: list[BaseException | None] = [None] * len(transfers)

        def consume(i: int) -> None:
            try:
                transfers[i].source = _View(self, i)
                transfers[i].send_weights()
            except BaseException as error:  # noqa: BLE001 - this transfer's, reported to the caller
                errors[i] = error
            finally:
                self.live[i] = False
                _drain(self.queues[i])

        threads = [threading.Thread(target=consume, args=(i,), name=f"ggpo-push-{i}", daemon=True)
                   for i in range(len(transfers))]
        for thread in threads:
            thread.start()
        for item in [*self.source, None]:  # None: the end of the pass
            for i, q in enumerate(self.queues):
                self._put(i, q, item)
        # Once the pass ended a transfer has at most three calls left (its last send, the update's reply, finish),
        # each bounded by the timeout: a slow transfer is never cut off mid-send, a hung one is.
        for i, thread in enumerate(threads):
            thread.join(3 * self.timeout)
            if thread.is_alive():
                errors[i] = TimeoutError(f"a transfer did not end within {3 * self.timeout:g} s of the pass")
        return errors

    def _put(self, i: int, q: queue.Queue, item: Any) -> None:
        while self.live[i]:
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


class _View:
    """One consumer's side of a :class:`SharedPass` (read once)."""

    def __init__(self, shared: SharedPass, index: int) -> None:
        self.shared, self.index = shared, index

    def metadata(self) -> list[Any]:
        return self.shared.source.metadata()

    def held_names(self) -> None:
        return None

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        q = self.shared.queues[self.index]
        while True:
            try:
                item = q.get(timeout=self.shared.timeout)
            except queue.Empty:
                raise TimeoutError(f"the weight pass produced nothing for {self.shared.timeout:g} s") from None
            if item is None:
                return
            yield item


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


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
