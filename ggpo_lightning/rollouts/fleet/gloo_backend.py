"""A weight-transfer backend for vLLM servers without GPUs: ``ggpo_gloo``, a torch.distributed gloo broadcast.

vLLM moves a trainer's weights into a running server through its weight-transfer API: the server side is a
``WeightTransferEngine`` chosen by ``--weight-transfer-config '{"backend": NAME}'`` and driven over HTTP
(``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``); the
trainer side is a ``TrainerWeightTransferEngine`` made by ``WeightTransferTrainerFactory.trainer_init``. Its
built-in backends need a GPU (``nccl``, ``ipc``). This module adds one that runs anywhere, so that the same protocol
runs against real servers on CPU (and in CI):

- **Registration.** :func:`register` adds the backend to both of vLLM's factories. The package declares it in the
  entry-point group ``vllm.general_plugins``, which every vLLM process loads at start-up (several times: a second
  registration is a no-op). A server finds it when this package is installed in its environment.
- **Rendezvous.** The trainer opens a ``TCPStore`` on a free port of ``master_address`` and a two-member gloo group
  (trainer rank 0, the server rank 1); the server joins from ``/init_weight_transfer_engine``. One group per server:
  a server that dies breaks its own group only.
- **A push.** ``start`` (vLLM's layer-wise reload, :mod:`~ggpo_lightning.rollouts.vllm.reload`: each layer is
  re-processed into kernel format as its weights arrive), ``update`` (the names, dtypes and shapes over HTTP, then
  the tensors), ``finish`` (with the output layer tied to the embedding re-processed too).
- **Buckets** (``bucket_bytes`` > 0, the default). Consecutive tensors of one dtype are packed into flat buckets of
  at most ``bucket_bytes`` (a larger tensor is a bucket of its own); the update info says how many tensors each
  holds. The trainer gathers, casts and packs bucket i+1 while bucket i is on the wire; the server receives bucket
  i+1 while it loads bucket i (one ``load_weights`` per bucket). Each side keeps two buckets allocated across
  pushes (no fresh page faults per push); what the reload still holds of a bucket (a layer not complete yet) is
  copied out before the bucket is reused. ``bucket_bytes: 0``: one tensor at a time, each loaded as it arrives.
- **Every server at once** (:func:`send_together`): one pass of the source, each bucket broadcast on every
  server's group at once (gloo sends them in its own threads). A server whose transfer fails drops out of the pass;
  the others go on.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from ggpo_lightning.rollouts.vllm.reload import finish_reload, keep_held_weights, start_reload

__all__ = ["BACKEND", "DEFAULT_BUCKET_BYTES", "GlooInitInfo", "GlooTrainerEngine", "GlooTrainerInitInfo",
           "GlooUpdateInfo", "GlooWeightTransferEngine", "bucket_counts", "register", "send_together"]

BACKEND = "ggpo_gloo"
"""The backend's name in vLLM's registries (``--weight-transfer-config '{"backend": "ggpo_gloo"}'``)."""

DEFAULT_BUCKET_BYTES = 128 << 20
"""Bytes of one packed bucket (two are kept on each side across pushes)."""

_REGISTER_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def register() -> None:
    """Add the backend to vLLM's worker-side and trainer-side factories (the ``vllm.general_plugins`` entry point);
    idempotent."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    with _REGISTER_LOCK:
        if BACKEND not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(BACKEND, __name__, "GlooWeightTransferEngine")
        if BACKEND not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory.register_engine(BACKEND, __name__, "GlooTrainerEngine")


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """What the server needs to join the trainer's group."""

    master_address: str
    master_port: int
    group_name: str
    timeout_seconds: float = 300.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One push: the tensors' names, dtypes and shapes, in the order they are broadcast, and how many tensors each
    packed bucket holds (empty: one tensor at a time)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_counts: list[int] = field(default_factory=list)


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """The trainer's side: where it listens (``master_address``: an address of this host the server can reach)."""

    backend: ClassVar[str] = BACKEND

    master_address: str = "127.0.0.1"
    timeout_seconds: float = 300.0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Bytes of one packed bucket (0: one tensor at a time)."""


def bucket_counts(sizes: list[int], dtypes: list[Any], bucket_bytes: int) -> list[int]:
    """How many consecutive tensors (of ``sizes`` bytes, of ``dtypes``) each bucket of at most ``bucket_bytes``
    holds: a bucket ends at a change of dtype or where the next tensor would overflow it (a tensor larger than a
    bucket is one of its own); empty when ``bucket_bytes`` is 0 (one tensor at a time)."""
    if bucket_bytes <= 0:
        return []
    counts: list[int] = []
    used, dtype = 0, None
    for size, kind in zip(sizes, dtypes):
        if counts and kind == dtype and used + size <= bucket_bytes:
            counts[-1] += 1
            used += size
        else:
            counts.append(1)
            used, dtype = size, kind
    return counts


def _buckets(entries: list[tuple[Any, int]], counts: list[int]) -> list[list[tuple[Any, int]]]:
    """``entries`` (each with its size in bytes) cut into consecutive buckets of ``counts`` entries."""
    buckets, start = [], 0
    for count in counts:
        buckets.append(entries[start:start + count])
        start += count
    return buckets


def _two_buffers(held: list[torch.Tensor] | None, size: int, device: Any = "cpu") -> list[torch.Tensor]:
    """Two flat byte buffers of at least ``size``: ``held`` when large enough (kept across pushes)."""
    if held is not None and held[0].numel() >= size:
        return held
    return [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]


def _group(store: dist.Store, name: str, rank: int, timeout_seconds: float) -> dist.ProcessGroup:
    # a group of its own (not the default one: the trainer may already run DDP/FSDP on gloo)
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, 2, datetime.timedelta(seconds=timeout_seconds))


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> dist.Work:
    """Broadcast ``tensor`` from the trainer (rank 0), asynchronously: gloo moves it in its own threads."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([tensor], options)


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """The server's side: joins the trainer's gloo group, receives each tensor and loads it as it arrives."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None
        self._buffers: list[torch.Tensor] | None = None  # the two receive buckets, kept across pushes

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self._store = dist.TCPStore(init_info.master_address, init_info.master_port, 2, is_master=False,
                                    timeout=datetime.timedelta(seconds=init_info.timeout_seconds))
        self.group = _group(self._store, init_info.group_name, 1, init_info.timeout_seconds)

    def start_weight_update(self) -> None:
        start_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(): there is nothing to wait for on CPU
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(f"the {BACKEND} weight transfer was not initialised: call /init_weight_transfer_engine")
        dtypes = [getattr(torch, name) for name in update_info.dtype_names]
        if not update_info.bucket_counts:
            for name, dtype, shape in zip(update_info.names, dtypes, update_info.shapes):
                tensor = torch.empty(shape, dtype=dtype, device=self.device)
                _broadcast(self.group, tensor).wait()
                self.model.load_weights([(name, tensor)])
            return
        entries = [((name, dtype, shape), _nbytes(shape, dtype))
                   for name, dtype, shape in zip(update_info.names, dtypes, update_info.shapes)]
        buckets = _buckets(entries, update_info.bucket_counts)
        sizes = [sum(size for _, size in bucket) for bucket in buckets]
        self._buffers = buffers = _two_buffers(self._buffers, max(sizes), self.device)
        waited, start = 0.0, time.perf_counter()
        receiving = _broadcast(self.group, buffers[0][:sizes[0]])
        for i, bucket in enumerate(buckets):
            began = time.perf_counter()
            receiving.wait()
            waited += time.perf_counter() - began
            if i + 1 < len(buckets):  # the next bucket arrives while this one loads
                receiving = _broadcast(self.group, buffers[(i + 1) % 2][:sizes[i + 1]])
            self.model.load_weights(_unpacked(buffers[i % 2], bucket))
            keep_held_weights(buffers[i % 2])
        seconds = time.perf_counter() - start
        log.info("%s: %.0f MB in %d buckets in %.2f s: %.2f s waiting for bytes, %.2f s loading", BACKEND,
                 sum(sizes) / 1e6, len(buckets), seconds, waited, seconds - waited)

    def finish_weight_update(self) -> None:
        finish_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.group, self._store, self._buffers = None, None, None


def _nbytes(shape: list[int], dtype: torch.dtype) -> int:
    count = 1
    for size in shape:
        count *= size
    return count * dtype.itemsize


def _unpacked(buffer: torch.Tensor, bucket: list[tuple[Any, int]]) -> list[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` views of a received bucket."""
    pairs, offset = [], 0
    for (name, dtype, shape), size in bucket:
        pairs.append((name, buffer[offset:offset + size].view(dtype).view(shape)))
        offset += size
    return pairs


class GlooTrainerEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """The trainer's side for one server: opens the group at :meth:`trainer_init`, pushes ``source`` at each
    :meth:`send_weights` (start, then update while broadcasting, then finish); :func:`send_together` pushes one
    source to several servers at once."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource | None = None,
                 is_sender: bool = True, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None
        self.bucket_bytes = bucket_bytes
        self.buffers: list[torch.Tensor] | None = None  # the two send buckets, kept across pushes

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> GlooTrainerEngine:
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, bucket_bytes=init_info.bucket_bytes)
        if not engine.is_sender:
            return engine
        timeout = datetime.timedelta(seconds=init_info.timeout_seconds)
        engine._store = dist.TCPStore(init_info.master_address, 0, 2, is_master=True, wait_for_workers=False,
                                      timeout=timeout)  # port 0: a free one, chosen by the store
        port = engine._store.port
        name = f"ggpo-weights-{port}"
        server_info = GlooInitInfo(init_info.master_address, port, name, init_info.timeout_seconds)
        opened: dict[str, Any] = {}

        def open_group() -> None:  # joined by the server inside its HTTP call: both at once
            try:
                opened["group"] = _group(engine._store, name, 0, init_info.timeout_seconds)
            except BaseException as error:  # noqa: BLE001 - raised below, in the caller's thread
                opened["error"] = error

        # a daemon thread: a server that refuses the call (the usual failure) leaves the group waiting for a peer
        # that never comes, until its timeout, without holding up the caller or the interpreter's exit
        opener = threading.Thread(target=open_group, name="ggpo-weights-rendezvous", daemon=True)
        opener.start()
        client.init_weight_transfer_engine(asdict(server_info))
        opener.join(init_info.timeout_seconds)
        if "group" not in opened:
            raise RuntimeError(f"the {BACKEND} weight-transfer group did not form: "
                               f"{opened.get('error', 'timed out')!r}")
        engine.group = opened["group"]
        return engine

    def send_weights(self) -> None:
        """Push :attr:`source` (re-iterated at every call) to the server."""
        if self.source is None:
            raise ValueError("send_weights needs a WeightSource")
        if not self.is_sender:
            for _ in self.source:  # the other ranks only take part in the gathers
                pass
            return
        error = send_together([self], self.source)[0]
        if error is not None:
            raise error

    def shutdown(self) -> None:
        self.group, self._store, self.buffers = None, None, None


def send_together(engines: list[GlooTrainerEngine], source: WeightSource) -> list[BaseException | None]:
    """One pass of ``source`` to the servers of ``engines`` at once (start, update while broadcasting, finish, each
    server's HTTP calls in threads of their own); per engine, the error that stopped its server's push (None: it
    took the weights). A server that fails drops out; the pass runs to its end whatever fails (the other trainer
    ranks are in its gathers)."""
    meta = source.metadata()
    dtype_names = [str(m.dtype).removeprefix("torch.") for m in meta]
    sizes = [_nbytes(list(m.shape), m.dtype) for m in meta]
    counts = bucket_counts(sizes, dtype_names, engines[0].bucket_bytes)
    info = asdict(GlooUpdateInfo([m.name for m in meta], dtype_names, [list(m.shape) for m in meta], counts))
    errors: list[BaseException | None] = [None] * len(engines)
    pool = ThreadPoolExecutor(max_workers=2 * len(engines), thread_name_prefix="ggpo-gloo-push")
    try:
        _each(engines, errors, pool, lambda e: e.client.start_weight_update())
        received = {i: pool.submit(e.client.update_weights, info) for i, e in enumerate(engines) if errors[i] is None}
        pairs = _checked(iter(source), meta)
        if counts:
            _send_buckets(engines, errors, pairs, _buckets(list(zip(meta, sizes)), counts))
        else:
            _send_tensors(engines, errors, pairs)
        for i, reply in received.items():
            if errors[i] is not None:  # its group broke: its call waits for bytes that never come
                continue
            try:
                reply.result()
            except Exception as error:  # noqa: BLE001 - this server's, reported to the caller
                errors[i] = errors[i] or error
        _each(engines, errors, pool, lambda e: e.client.finish_weight_update())
    finally:
        pool.shutdown(wait=False)  # a failed broadcast leaves its server's call hanging until its timeout
    return errors


def _each(engines: list[GlooTrainerEngine], errors: list[BaseException | None], pool: ThreadPoolExecutor,
          call: Callable[[GlooTrainerEngine], Any]) -> None:
    """``call`` on every engine still in the push, at once; a failure drops its engine out."""
    futures = {i: pool.submit(call, engine) for i, engine in enumerate(engines) if errors[i] is None}
    for i, future in futures.items():
        try:
            future.result()
        except Exception as error:  # noqa: BLE001 - this server's, reported to the caller
            errors[i] = error


def _checked(pairs: Iterator[tuple[str, torch.Tensor]], meta: list[Any]) -> Iterator[torch.Tensor]:
    """The stream's tensors, each checked against the metadata the servers were given."""
    for (name, tensor), expected in zip(pairs, meta, strict=True):
        if name != expected.name or tuple(tensor.shape) != expected.shape or tensor.dtype != expected.dtype:
            raise ValueError(f"the weight stream disagrees with its metadata at {name!r}")
        yield tensor


def _send_tensors(engines: list[GlooTrainerEngine], errors: list[BaseException | None],
                  tensors: Iterator[torch.Tensor]) -> None:
    """One tensor at a time, to every server at once."""
    for tensor in tensors:
        tensor = tensor.detach().contiguous()
        _wait(engines, errors, [(i, _broadcast(e.group, tensor)) for i, e in enumerate(engines) if errors[i] is None])


def _send_buckets(engines: list[GlooTrainerEngine], errors: list[BaseException | None],
                  tensors: Iterator[torch.Tensor], buckets: list[list[tuple[Any, int]]]) -> None:
    """Bucket by bucket, to every server at once: bucket i+1 is gathered, cast and packed while bucket i is on the
    wire (two send buffers, kept on the first engine across pushes)."""
    sizes = [sum(size for _, size in bucket) for bucket in buckets]
    engines[0].buffers = buffers = _two_buffers(engines[0].buffers, max(sizes))
    in_flight: list[list[tuple[int, dist.Work]]] = [[], []]
    for k, bucket in enumerate(buckets):
        buffer = buffers[k % 2]
        _wait(engines, errors, in_flight[k % 2])  # bucket k-2 left this buffer
        offset = 0
        for _, size in bucket:
            buffer[offset:offset + size].copy_(next(tensors).detach().contiguous().view(-1).view(torch.uint8))
            offset += size
        in_flight[k % 2] = [(i, _broadcast(e.group, buffer[:sizes[k]])) for i, e in enumerate(engines)
                            if errors[i] is None]
    for works in in_flight:
        _wait(engines, errors, works)


def _wait(engines: list[GlooTrainerEngine], errors: list[BaseException | None],
          works: list[tuple[int, dist.Work]]) -> None:
    for i, work in works:
        try:
            work.wait()
        except Exception as error:  # noqa: BLE001 - this server's group broke: it drops out of the push
            errors[i] = errors[i] or error
