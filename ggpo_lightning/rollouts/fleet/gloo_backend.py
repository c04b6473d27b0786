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
  re-processed into kernel format as its weights arrive), ``update`` (the names, dtypes and shapes over HTTP; the
  tensors broadcast one at a time, each loaded as it arrives: no second copy of the model), ``finish`` (with the
  output layer tied to the embedding re-processed too).
"""

from __future__ import annotations

import datetime
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
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

from ggpo_lightning.rollouts.vllm.reload import finish_reload, start_reload

__all__ = ["BACKEND", "GlooInitInfo", "GlooTrainerEngine", "GlooTrainerInitInfo", "GlooUpdateInfo",
           "GlooWeightTransferEngine", "register"]

BACKEND = "ggpo_gloo"
"""The backend's name in vLLM's registries (``--weight-transfer-config '{"backend": "ggpo_gloo"}'``)."""

_REGISTER_LOCK = threading.Lock()


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
    """One push: the tensors' names, dtypes and shapes, in the order they are broadcast."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """The trainer's side: where it listens (``master_address``: an address of this host the server can reach)."""

    backend: ClassVar[str] = BACKEND

    master_address: str = "127.0.0.1"
    timeout_seconds: float = 300.0


def _group(store: dist.Store, name: str, rank: int, timeout_seconds: float) -> dist.ProcessGroup:
    # a group of its own (not the default one: the trainer may already run DDP/FSDP on gloo)
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, 2, datetime.timedelta(seconds=timeout_seconds))


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """The server's side: joins the trainer's gloo group, receives each tensor and loads it as it arrives."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None

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
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
            _broadcast(self.group, tensor)
            self.model.load_weights([(name, tensor)])

    def finish_weight_update(self) -> None:
        finish_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.group, self._store = None, None


class GlooTrainerEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """The trainer's side for one server: opens the group at :meth:`trainer_init`, pushes ``source`` at each
    :meth:`send_weights` (start, then update while broadcasting, then finish)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource | None = None,
                 is_sender: bool = True) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> GlooTrainerEngine:
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
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
        source = self.source
        if source is None:
            raise ValueError("send_weights needs a WeightSource")
        meta = source.metadata()
        if not self.is_sender:
            for _ in source:  # the other ranks only take part in the gathers
                pass
            return
        info = GlooUpdateInfo([m.name for m in meta], [str(m.dtype).removeprefix("torch.") for m in meta],
                              [list(m.shape) for m in meta])
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(info))
            for (name, tensor), expected in zip(source, meta, strict=True):
                if name != expected.name or tuple(tensor.shape) != expected.shape or tensor.dtype != expected.dtype:
                    raise ValueError(f"the weight stream disagrees with its metadata at {name!r}")
                _broadcast(self.group, tensor.detach().contiguous())
            received.result()
        finally:
            pool.shutdown(wait=False)  # a failed broadcast leaves the server's call hanging until its timeout
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group, self._store = None, None
