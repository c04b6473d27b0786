"""The HF engine with its sampling in a child process: asynchronous rollouts that do not share the GIL.

A producer *thread* (:mod:`~ggpo_lightning.producer`) overlaps generation with training
only as far as both release the GIL; a small model's steps are mostly Python (HF
``generate``'s loop, module calls, autograd bookkeeping), and two such threads take turns
rather than run side by side. :class:`ChildProcessEngine` keeps the engine's model in
shared memory and runs ``generate`` in a child process on it: the producer thread only
sends token ids and waits (GIL released), and a weight sync stays an in-place copy into
the shared weights (:meth:`HFGenerateEngine.load_weights`, in the parent, while the child
is idle: the producer never loads and generates at once).

CPU only: a model on another device samples in the calling thread (CUDA kernels release
the GIL for their duration anyway). The child samples from its own torch RNG, seeded from
the parent's at start; it exits with its parent (its pipe closes).
"""

from __future__ import annotations

import contextlib
import traceback
from multiprocessing.connection import Connection

import torch
from torch import nn

from ggpo_lightning.rollout import Generation, HFGenerateEngine, SamplingConfig, _cached_weight_casts, autocast_device

__all__ = ["ChildProcessEngine"]


class ChildProcessEngine(HFGenerateEngine):
    """:class:`HFGenerateEngine` (a private copy of the learner, loaded at each sync) whose ``generate`` runs in a
    child process started at the first call, on the same weights in shared memory. The child samples under the
    autocast of the thread of that first call (``bf16-mixed``). :meth:`close` stops it."""

    def __init__(self, learner: nn.Module, tokenizer, dtype: torch.dtype | None = None,
                 record_logprobs: bool = False) -> None:
        super().__init__(learner, tokenizer, dtype=dtype, record_logprobs=record_logprobs, share=False)
        self._child = None
        self._conn: Connection | None = None

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        if next(self.model.parameters()).device.type != "cpu":
            return super().generate(prompt_ids, n, sampling)
        if self._child is None:
            self._start()
        self._conn.send((prompt_ids, n, sampling))
        try:
            status, payload = self._conn.recv()
        except EOFError as error:
            raise RuntimeError(f"the generation process (pid {self._child.pid}) died, exit code "
                               f"{self._child.exitcode}") from error
        if status != "ok":
            raise RuntimeError(f"generation failed in the generation process:\n{payload}")
        return payload

    def _start(self) -> None:
        self.model.share_memory()  # in place: load_weights keeps copying into these storages
        device = autocast_device(self)
        autocast = torch.get_autocast_dtype(device) if device else None
        seed = int(torch.randint(2**62, ()).item())  # from the run's RNG: a seeded run starts the child alike
        context = torch.multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        self._child = context.Process(target=_serve, name="ggpo-generate", daemon=True,
                                      args=(self.model, self.tokenizer, self.record_logprobs, autocast, seed,
                                            torch.get_num_threads(), child_end))
        self._child.start()
        child_end.close()

    def close(self) -> None:
        """Stop the child process (a later ``generate`` starts a new one). Idempotent."""
        if self._child is None:
            return
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._child.join(timeout=30)
        if self._child.is_alive():
            self._child.kill()
            self._child.join()
        self._conn.close()
        self._child, self._conn = None, None


def _serve(model: nn.Module, tokenizer, record_logprobs: bool, autocast: torch.dtype | None, seed: int,
           threads: int, conn: Connection) -> None:
    """The child: generate for each request ``(prompt_ids, n, sampling)`` until ``None`` or the parent is gone."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    engine = HFGenerateEngine(model, tokenizer, record_logprobs=record_logprobs, share=True)
    device = next(model.parameters()).device.type
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone (killed included)
            return
        if request is None:
            return
        try:
            with torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext():
                with _cached_weight_casts(engine):
                    reply = ("ok", engine.generate(*request))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", traceback.format_exc())
        conn.send(reply)
