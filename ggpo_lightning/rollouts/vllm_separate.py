"""vLLM as a separate engine: a child process of its own, optionally on a GPU of its own (``vllm_placement: separate``).

:class:`SeparateVLLMEngine` implements :class:`~ggpo_lightning.rollouts.engine.RolloutEngine` by
running a :class:`~ggpo_lightning.rollouts.vllm_engine.VLLMEngine` (its generation and weight
loading, unchanged) in a spawned child process. The trainer process only sends token ids
and waits on a pipe, with the GIL released: the producer thread of
``model.rollout.schedule: async`` (:mod:`~ggpo_lightning.rollouts.producer`) can wait on it while the
learner trains, which a vLLM engine in the trainer process would not allow (both would run
Python under one GIL).

- **Devices.** ``devices`` (``model.rollout.vllm_devices``) are GPU indices as the trainer
  sees them (mapped through the trainer's own ``CUDA_VISIBLE_DEVICES`` when set); the child
  gets ``CUDA_VISIBLE_DEVICES`` set to those GPUs before it imports vLLM, so vLLM sees only
  them. Unset, the child sees what the trainer sees and vLLM takes the
  first (the trainer's GPU on a one-GPU machine: share memory with
  ``vllm_args.gpu_memory_utilization``). On a machine without CUDA the engine runs on CPU
  and ``devices`` is an error. On its own GPU the engine neither sleeps between rollouts
  nor keeps to the colocated engine's 0.3 memory share (0.85 instead;
  ``model.rollout.vllm_args`` overrides both).
- **Weight sync.** The learner's weights are written, cast to the engine's dtype, into
  shared-memory host buffers made once when the child starts (one tensor per name of
  ``layout``, the learner's plain state); the child then streams ``(name, buffer)`` pairs
  from them into vLLM's model (:meth:`VLLMEngine.load_weights`). Nothing is pickled per
  sync, and the host holds one extra copy of the weights (in the engine's dtype) for the
  run. The trainer waits for the load, so the buffers are never written while read.
- **Seeds.** Each prompt's request seed is drawn in the trainer process from torch's global
  RNG (:func:`~ggpo_lightning.rollouts.vllm_engine.draw_seeds`), as the colocated engine does: a
  synchronous run samples the same responses with either placement.
- **Versions** are kept in the trainer process (``version``); the child holds weights only.
- **Lifetime** (:class:`~ggpo_lightning.rollouts.child_process.ChildProcess`). The child starts at
  the first request and builds vLLM then (its errors are raised here with the child's
  traceback); it exits when the trainer closes it (:meth:`close`, idempotent) or when its
  pipe closes (the trainer is gone, killed included, once the request in progress ends;
  tested). A child that died is a
  ``RuntimeError`` naming its pid and exit code.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import Tensor

from ggpo_lightning.rollouts.child_process import ChildProcess, serve
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.engine import Generation, SyncedOnResume, Weights, copy_pairs, weight_pairs
from ggpo_lightning.rollouts.vllm_engine import VLLMEngine, draw_seeds

__all__ = ["OWN_DEVICE_DEFAULTS", "SeparateVLLMEngine"]

OWN_DEVICE_DEFAULTS = {"enable_sleep_mode": False, "gpu_memory_utilization": 0.85}
"""``vllm.LLM`` defaults of an engine on GPUs of its own: nothing else uses their memory, so it neither sleeps
between rollouts (that would free memory for nobody and cost a reload) nor keeps to the colocated share."""


class SeparateVLLMEngine(SyncedOnResume):
    """A :class:`VLLMEngine` in a child process, synced through shared-memory buffers.

    Args:
        model_name_or_path, tokenizer, dtype, record_logprobs, engine_args: as :class:`VLLMEngine`'s.
        layout: the names and shapes of the weights a sync streams (the learner's plain state dict,
            e.g. ``model.state_dict()``; only shapes are kept): the shared buffers are made from it.
        devices: GPU indices for the engine (``CUDA_VISIBLE_DEVICES`` of the child); None = the trainer's.

    Raises:
        ValueError: ``devices`` on a machine without CUDA, or naming a GPU it does not have.
    """

    def __init__(self, model_name_or_path: str, tokenizer, dtype: torch.dtype, layout: Mapping[str, Tensor],
                 record_logprobs: bool = False, engine_args: Mapping[str, Any] | None = None,
                 devices: Sequence[int] | None = None) -> None:
        self.visible_devices = None if devices is None else _visible_devices(devices)
        """The child's ``CUDA_VISIBLE_DEVICES`` (None: inherited)."""
        if devices is not None:
            engine_args = {**OWN_DEVICE_DEFAULTS, **(engine_args or {})}
        self._engine_spec = (str(model_name_or_path), tokenizer, dtype, record_logprobs, dict(engine_args or {}))
        self.dtype = dtype
        self._shapes = {name: tuple(tensor.shape) for name, tensor in layout.items()}
        self._buffers: dict[str, Tensor] = {}
        self.version = 0
        self._child = ChildProcess("the vLLM engine process")

    @property
    def pid(self) -> int | None:
        """The child's process id (None before the first request and after :meth:`close`)."""
        return self._child.pid

    def to(self, device: torch.device | str) -> SeparateVLLMEngine:
        """A no-op: the engine's device is its own (``devices``)."""
        return self

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        """``n`` samples per prompt; each prompt's seed drawn here, from torch's global RNG."""
        return self._request("generate_seeded", prompt_ids, n, sampling, draw_seeds(len(prompt_ids)))

    def greedy(self, prompt_ids: list[list[int]], max_new_tokens: int) -> list[Generation]:
        """One greedy (argmax) response per prompt."""
        return self._request("greedy", prompt_ids, max_new_tokens)

    def load_weights(self, learner: Weights, version: int) -> None:
        """Write the learner's weights into the shared buffers (cast to the engine's dtype), have the child stream
        them into vLLM, and record ``version``.

        Raises:
            KeyError: the stream has a name outside ``layout``, or misses one of it (nothing is sent then).
            RuntimeError: the load failed in the child (its traceback) or the child died.
        """
        self._ensure_started()
        with torch.no_grad():
            copy_pairs(self._buffers, weight_pairs(learner))
        self._request("load_shared", version)
        self.version = version

    def collective_rpc(self, method: Callable, args: tuple = ()) -> list[Any]:
        """``method(worker, *args)`` on vLLM's worker in the child (``LLM.collective_rpc``); ``method`` must be
        importable by name (a module-level function) and its result picklable. For inspection and tests."""
        return self._request("collective_rpc", method, args)

    def _request(self, name: str, *args) -> Any:
        self._ensure_started()
        return self._child.request((name, args))

    def _ensure_started(self) -> None:
        if self._child.process is not None:
            return
        self._buffers = {name: torch.empty(shape, dtype=self.dtype).share_memory_()
                         for name, shape in self._shapes.items()}
        self._child.start(_serve, (self._engine_spec, self._buffers, self.visible_devices), name="ggpo-vllm-engine")
        try:
            self._child.reply()  # vLLM built, or why not
        except RuntimeError as error:
            self.close()
            raise RuntimeError(f"the vLLM engine process could not start the engine: {error}") from error

    def close(self) -> None:
        """Stop the child process and free the shared buffers (a later request starts a new child, at the folder's
        weights until the next sync). Idempotent."""
        self._child.close()
        self._buffers = {}


def _visible_devices(devices: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the GPUs the trainer numbers ``devices`` (through its own
    ``CUDA_VISIBLE_DEVICES`` when set: index 1 of "2,3" is GPU 3)."""
    if not torch.cuda.is_available():
        raise ValueError(f"model.rollout.vllm_devices: {list(devices)} names GPUs, but this machine has no CUDA GPU; "
                         "leave it unset (null) to run the separate vLLM engine on CPU")
    count = torch.cuda.device_count()
    missing = [d for d in devices if not 0 <= d < count]
    if missing:
        raise ValueError(f"model.rollout.vllm_devices: GPUs {missing} do not exist here ({count} visible to the "
                         "trainer, numbered from 0)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",")[:count] if visible else [str(i) for i in range(count)]
    return ",".join(ids[d] for d in devices)


class _Served:
    """The child's requests, by name, on its :class:`VLLMEngine` and the shared buffers."""

    def __init__(self, engine: VLLMEngine, buffers: dict[str, Tensor]) -> None:
        self.engine, self.buffers = engine, buffers

    def generate_seeded(self, prompt_ids, n, sampling, seeds) -> list[Generation]:
        return self.engine.generate_seeded(prompt_ids, n, sampling, seeds)

    def greedy(self, prompt_ids, max_new_tokens) -> list[Generation]:
        return self.engine.greedy(prompt_ids, max_new_tokens)

    def load_shared(self, version: int) -> None:
        self.engine.load_weights(iter(self.buffers.items()), version=version)

    def collective_rpc(self, method, args) -> list[Any]:
        return self.engine.llm.collective_rpc(method, args=args)


def _serve(spec: tuple, buffers: dict[str, Tensor], visible_devices: str | None, conn: Connection) -> None:
    """The child: build the engine, report ready (or the error), then answer each request ``(name, args)`` with
    ``_Served``'s method of that name until ``None`` or the parent is gone."""
    if visible_devices is not None:  # before vLLM (and CUDA) initialise: vLLM sees only these GPUs
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
    try:
        served = _Served(VLLMEngine(*spec), buffers)
        served.engine.llm  # built now: a start-up failure is reported at start, not at the first rollout
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    serve(conn, lambda request: getattr(served, request[0])(*request[1]))
