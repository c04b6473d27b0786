"""A spawned child process answering requests over a pipe: the plumbing of the HF engine that generates in a process
of its own (:mod:`~ggpo_lightning.rollouts.child_engine`, the async schedule's worker).

The parent sends a request and waits for its reply on the pipe (the GIL released meanwhile);
the child answers ``("ok", result)`` or ``("error", traceback)`` and keeps serving. A child
that died is a ``RuntimeError`` naming its pid and exit code; the child exits when told
(``None``) or when its pipe closes (the parent is gone, killed included).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

__all__ = ["ChildProcess", "serve"]


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
