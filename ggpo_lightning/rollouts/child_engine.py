"""The HF engine with its sampling in a child process: asynchronous rollouts that do not share the GIL.

A producer *thread* (:mod:`~ggpo_lightning.rollouts.producer`) overlaps generation with training
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
from multiprocessing.connection import Connection

import torch
from torch import nn

from ggpo_lightning.rollouts.child_process import ChildProcess, serve
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.engine import Generation, autocast_device, cached_weight_casts
from ggpo_lightning.rollouts.hf_engine import HFGenerateEngine

__all__ = ["ChildProcessEngine"]


class ChildProcessEngine(HFGenerateEngine):
    """:class:`HFGenerateEngine` (a private copy of the learner, loaded at each sync) whose ``generate`` runs in a
    child process started at the first call, on the same weights in shared memory. The child samples under the
    autocast of the thread of that first call (``bf16-mixed``). :meth:`close` stops it."""

    def __init__(self, learner: nn.Module, tokenizer, dtype: torch.dtype | None = None,
                 record_logprobs: bool = False) -> None:
        super().__init__(learner, tokenizer, dtype=dtype, record_logprobs=record_logprobs, share=False)
        self._child = ChildProcess("the generation process")

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        if next(self.model.parameters()).device.type != "cpu":
            return super().generate(prompt_ids, n, sampling)
        if self._child.process is None:
            self._start()
        return self._child.request((prompt_ids, n, sampling))

    def _start(self) -> None:
        self.model.share_memory()  # in place: load_weights keeps copying into these storages
        device = autocast_device(self)
        autocast = torch.get_autocast_dtype(device) if device else None
        seed = int(torch.randint(2**62, ()).item())  # from the run's RNG: a seeded run starts the child alike
        self._child.start(_serve, (self.model, self.tokenizer, self.record_logprobs, autocast, seed,
                                   torch.get_num_threads()), name="ggpo-generate")

    def close(self) -> None:
        """Stop the child process (a later ``generate`` starts a new one). Idempotent."""
        self._child.close()


def _serve(model: nn.Module, tokenizer, record_logprobs: bool, autocast: torch.dtype | None, seed: int,
           threads: int, conn: Connection) -> None:
    """The child: generate for each request ``(prompt_ids, n, sampling)`` until ``None`` or the parent is gone."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    engine = HFGenerateEngine(model, tokenizer, record_logprobs=record_logprobs, share=True)
    device = next(model.parameters()).device.type

    def generate(request: tuple) -> list[Generation]:
        with torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext():
            with cached_weight_casts(engine):
                return engine.generate(*request)

    serve(conn, generate)
