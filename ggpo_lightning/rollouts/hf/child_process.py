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

The plumbing (:class:`ChildProcess`, :func:`serve`): the parent sends a request and waits for its reply on the pipe
(the GIL released meanwhile); the child answers ``("ok", result)`` or ``("error", traceback)`` and keeps serving. A
child that died is a ``RuntimeError`` naming its pid and exit code; the child exits when told (``None``) or when
its pipe closes (the parent is gone, killed included).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import nn

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.protocol import Generation, autocast_device, cached_weight_casts
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine

__all__ = ["ChildProcess", "ChildProcessEngine", "serve"]


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


class ChildProcess:
    """One spawned child and the parent's end of its pipe; ``label`` names it in errors (e.g. "the generation
    process")."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.process = None
        """The ``multiprocessing`` process (None before :meth:`start` and after :meth:`close`)."""
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, target: Callable[..., None], args: tuple, name: str) -> None:
        """Spawn ``target(*args, conn)`` (a fresh interpreter: no CUDA state or threads inherited), ``conn`` its end
        of the pipe."""
        context = torch.multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        self.process = context.Process(target=target, name=name, daemon=True, args=(*args, child_end))
        self.process.start()
        child_end.close()  # only the child holds it now: its exit is seen here as EOF

    def request(self, message: Any) -> Any:
        """Send ``message``, return the child's result (:meth:`reply`)."""
        try:
            self._conn.send(message)
        except OSError as error:
            raise self._died() from error
        return self.reply()

    def reply(self) -> Any:
        """The child's next reply's result.

        Raises:
            RuntimeError: the child failed (its traceback in the message) or died (its pid and exit code).
        """
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as error:
            raise self._died() from error
        if status != "ok":
            raise RuntimeError(f"{self.label} (pid {self.pid}) failed:\n{payload}")
        return payload

    def _died(self) -> RuntimeError:
        self.process.join(timeout=10)  # the exit code is known once the process is reaped
        return RuntimeError(f"{self.label} (pid {self.pid}) died, exit code {self.process.exitcode}; its output "
                            "above may say why (e.g. out of memory)")

    def close(self) -> None:
        """Tell the child to exit (killed after 30 s). Idempotent."""
        if self.process is None:
            return
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self._conn.close()
        self.process, self._conn = None, None


def serve(conn: Connection, answer: Callable[[Any], Any]) -> None:
    """The child's loop: ``answer`` each request until ``None`` or the parent is gone; an exception is sent back
    with its traceback and the loop goes on."""
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone (killed included)
            return
        if request is None:
            return
        try:
            reply = ("ok", answer(request))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", traceback.format_exc())
        conn.send(reply)
