"""A pool of verifier worker processes whose deadlines the parent enforces.

Why not ``concurrent.futures.ProcessPoolExecutor``: ``future.result(timeout)`` returns
but leaves a hung worker running, and the next task queues behind it. Why not
``multiprocessing`` at all: it refuses to start children from daemonic processes, and
PyTorch DataLoader workers are daemonic. So each worker is a fresh interpreter started
with ``subprocess`` (spawn semantics: no state inherited from a trainer holding threads
or CUDA), talking to the parent over a private socket pair.

Contract:

* Each task has a wall-clock deadline of ``timeout`` seconds from dispatch. At the
  deadline the parent SIGKILLs the worker (signals inside the worker cannot interrupt
  long C-level work such as a huge integer power) and starts a replacement; the task
  scores ``TIMEOUT``. A worker that dies or breaks the protocol scores ``CRASHED`` and is
  replaced; so is one that reported ``CRASHED`` (its state may be damaged) and one that
  has run ``max_tasks_per_worker`` tasks.
* Workers only ever send fixed-size records (task index, status code, float) plus, for
  gold checks, a short reason text. The parent never unpickles anything from a worker.
* ``run`` may be called from any thread; calls are serialized. No signals are used in
  the parent, so nothing depends on being in the main thread.
* Workers are killed by ``close()``, by garbage collection of the pool and at
  interpreter exit; if the parent dies anyway, each worker exits on its own when its
  socket closes or it is orphaned.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from ggpo_verifiers.records import Status

# Protocol: worker -> parent messages are a 1-byte tag and a fixed body.
READY = b"R"
FAILED = b"E"  # + UTF-8 traceback of a startup failure
RESULT = b"T"  # + RESULT_BODY + optional UTF-8 reason (gold checks only)
RESULT_BODY = struct.Struct("<qBd")  # task index, status, score
MAX_REASON_BYTES = 1000
_MAX_MESSAGE = 1 + RESULT_BODY.size + MAX_REASON_BYTES + 8192

# The worker starts with only the standard library, adopts the parent's sys.path (so
# plugins importable in the parent are importable there) and then imports the package.
_BOOT = """\
import pickle, sys
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
sys.path[:] = pickle.loads(conn.recv_bytes())
from ggpo_verifiers.worker import serve
serve(conn)
"""


class WorkerStartupError(RuntimeError):
    """Verifier workers could not be started (e.g. the verifier's module fails to import
    in a fresh interpreter, or its ``warmup`` raised)."""


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen
    conn: Connection
    deadline: float  # startup deadline until ready, then the running task's deadline
    ready: bool = False
    task: int | None = None
    done: int = 0


@dataclass
class _Batch:
    tasks: Sequence[tuple[str, tuple]]
    results: list = field(default_factory=list)
    queue: deque = field(default_factory=deque)
    remaining: int = 0


class WorkerPool:
    """Run ``(method, args)`` tasks of one pickled verifier in worker processes.

    Args:
        verifier_payload: ``pickle.dumps(verifier)``; each worker unpickles it.
        workers: Number of worker processes.
        timeout: Wall-clock seconds per task before its worker is killed.
        max_tasks_per_worker: Replace a worker after this many tasks.
        memory_limit_mb: RLIMIT_AS of each worker, or None.
        startup_timeout: Seconds a new worker may take to report ready.
    """

    def __init__(
        self,
        verifier_payload: bytes,
        *,
        workers: int,
        timeout: float,
        max_tasks_per_worker: int,
        memory_limit_mb: int | None,
        startup_timeout: float = 60.0,
    ) -> None:
        self._init_message = pickle.dumps({"verifier": verifier_payload, "memory_limit_mb": memory_limit_mb})
        self._size = workers
        self._timeout = timeout
        self._max_tasks = max_tasks_per_worker
        self._startup_timeout = startup_timeout
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._startup_deaths = 0
        # Kill workers when the pool is garbage collected or the interpreter exits.
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._owner_pid)

    def usable_here(self) -> bool:
        """False in a forked child: the workers belong to the parent process."""
        return os.getpid() == self._owner_pid

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring and tests)."""
        return [w.proc.pid for w in self._workers]

    def run(self, tasks: Sequence[tuple[str, tuple]]) -> list[tuple[Status, float, str]]:
        """Run each ``(method, args)`` task; return ``(status, score, reason)`` per task,
        in order. A task that times out or kills its worker gets TIMEOUT or CRASHED."""
        batch = _Batch(tasks, [None] * len(tasks), deque(range(len(tasks))), len(tasks))
        with self._lock:
            self._fill()
            try:
                while batch.remaining:
                    self._dispatch(batch)
                    self._wait(batch)
            except BaseException:  # e.g. KeyboardInterrupt: late results must not leak
                self._drop_busy()  # into the next batch, so drop the workers owing them
                raise
        return batch.results

    def close(self) -> None:
        """Kill all workers. The pool can be used again afterwards (it starts new ones)."""
        with self._lock:
            _kill_all(self._workers, self._owner_pid)

    # ------------------------------------------------------------------ internals

    def _fill(self) -> None:
        while len(self._workers) < self._size:
            self._workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        parent_end, child_end = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, str(child_end.fileno())],
                pass_fds=[child_end.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches the trainer only
            )
        finally:
            child_end.close()
        conn = Connection(parent_end.detach())
        try:
            conn.send_bytes(pickle.dumps(sys.path))
            conn.send_bytes(self._init_message)
        except OSError:
            pass  # it died at once: reading its socket reports a startup death
        return _Worker(proc, conn, deadline=time.monotonic() + self._startup_timeout)

    def _drop_busy(self) -> None:
        for worker in [w for w in self._workers if w.task is not None]:
            _kill(worker)
            self._workers.remove(worker)

    def _replace(self, worker: _Worker) -> None:
        _kill(worker)
        self._workers[self._workers.index(worker)] = self._spawn()

    def _dispatch(self, batch: _Batch) -> None:
        for worker in list(self._workers):
            if not batch.queue:
                return
            if worker.ready and worker.task is None:
                index = batch.queue.popleft()
                method, args = batch.tasks[index]
                try:
                    worker.conn.send_bytes(pickle.dumps((index, method, args)))
                except OSError:  # died while idle: not this task's fault, retry it
                    batch.queue.appendleft(index)
                    self._replace(worker)
                    continue
                worker.task = index
                worker.deadline = time.monotonic() + self._timeout

    def _wait(self, batch: _Batch) -> None:
        busy = [w for w in self._workers if w.task is not None or not w.ready]
        next_deadline = min(w.deadline for w in busy)
        ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
        for worker in [w for w in busy if w.conn in ready]:
            self._receive(worker, batch)
        now = time.monotonic()
        for worker in busy:
            # a result received just now (at or past its deadline) has finished the task: nothing to expire
            still_busy = worker.task is not None or not worker.ready
            if worker in self._workers and still_busy and worker.deadline <= now:
                self._expire(worker, batch)

    def _receive(self, worker: _Worker, batch: _Batch) -> None:
        try:
            message = worker.conn.recv_bytes(_MAX_MESSAGE)
        except (EOFError, OSError):
            message = b""  # the worker died (or sent an oversized message)
        if not worker.ready:
            self._on_startup_message(worker, message)
            return
        body = message[1 : 1 + RESULT_BODY.size]
        if message[:1] != RESULT or len(body) != RESULT_BODY.size:
            self._finish(worker, batch, Status.CRASHED, 0.0, "")
            self._replace(worker)
            return
        index, code, score = RESULT_BODY.unpack(body)
        try:
            status = Status(code) if index == worker.task else Status.CRASHED
        except ValueError:  # not a status code: a protocol violation
            status = Status.CRASHED
        if status is Status.CRASHED:
            score = 0.0
        reason = message[1 + RESULT_BODY.size :].decode("utf-8", "replace")
        self._finish(worker, batch, status, score, reason)
        if status is Status.CRASHED or worker.done >= self._max_tasks:
            self._replace(worker)

    def _on_startup_message(self, worker: _Worker, message: bytes) -> None:
        if message == READY:
            worker.ready = True
            self._startup_deaths = 0
            return
        if message[:1] == FAILED:
            _kill_all(self._workers, self._owner_pid)
            detail = message[1:].decode("utf-8", "replace")
            raise WorkerStartupError(f"a verifier worker failed to start:\n{detail}")
        self._startup_deaths += 1
        if self._startup_deaths >= 3:
            _kill_all(self._workers, self._owner_pid)
            raise WorkerStartupError(
                "verifier workers keep dying during startup (exit status "
                f"{worker.proc.poll()}); check memory_limit_mb and that the verifier imports cleanly"
            )
        self._replace(worker)

    def _expire(self, worker: _Worker, batch: _Batch) -> None:
        if not worker.ready:
            _kill_all(self._workers, self._owner_pid)
            raise WorkerStartupError(
                f"a verifier worker did not start within {self._startup_timeout:g} s"
            )
        self._finish(worker, batch, Status.TIMEOUT, 0.0, "")
        self._replace(worker)

    def _finish(self, worker: _Worker, batch: _Batch, status: Status, score: float, reason: str) -> None:
        batch.results[worker.task] = (status, score, reason)
        batch.remaining -= 1
        worker.task = None
        worker.done += 1


def _kill(worker: _Worker) -> None:
    worker.conn.close()
    if worker.proc.poll() is None:
        worker.proc.kill()  # SIGKILL: cannot be caught or delayed by C-level work
    worker.proc.wait()


def _kill_all(workers: list[_Worker], owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked copy of the pool: these workers are the parent's to kill
    while workers:
        _kill(workers.pop())
