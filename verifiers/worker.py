"""The verifier worker process: receive tasks, run checks in the main thread, reply.

Started by ``ggpo_verifiers.pool`` (never imported by the trainer). Before taking tasks
the worker:

1. unpickles the verifier and runs its ``warmup`` (heavy imports happen here);
2. caps its address space (RLIMIT_AS) so a runaway computation gets a MemoryError
   instead of the machine's memory, and disables core dumps;
3. unless the verifier sets ``allow_side_effects``, installs an audit hook that refuses
   process creation, sockets, file writes and ``ctypes`` loading. Built-in verifiers
   never evaluate model text; this is defense in depth should any library on the path
   do so (sympy's string parsing is ``eval``). Audit hooks are not a sandbox against
   code written to evade them; they stop the payloads that matter here;
4. starts a thread that exits the process if the parent disappears.

Replies carry only a status code, a float and (for gold checks) a short reason: never
text derived from a parsed object.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from ggpo_verifiers.base import Verifier, run_check
from ggpo_verifiers.pool import FAILED, MAX_REASON_BYTES, READY, RESULT, RESULT_BODY

# Audit events that create processes, touch the network or change the file system.
_FORBIDDEN_EVENTS = frozenset(
    {
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "subprocess.Popen", "pty.spawn", "os.startfile",
        "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
        "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.link", "os.symlink",
        "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "shutil.copyfile",
        "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
    }
)  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def serve(conn: Connection) -> None:
    """Worker main loop; returns never (exits the process when the parent goes away)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    sys.dont_write_bytecode = True
    try:
        init = pickle.loads(conn.recv_bytes())
        verifier: Verifier = pickle.loads(init["verifier"])
        verifier.warmup()
        _limit_resources(init["memory_limit_mb"])
        if not verifier.allow_side_effects:
            sys.addaudithook(_refuse_side_effects)
        _exit_with_parent()
    except BaseException:
        conn.send_bytes(FAILED + traceback.format_exc()[-8000:].encode())
        os._exit(1)
    conn.send_bytes(READY)
    while True:
        try:
            index, method, args = pickle.loads(conn.recv_bytes())
        except EOFError:
            os._exit(0)  # the pool closed our socket: retired
        status, score, reason = run_check(verifier, method, args)
        body = RESULT_BODY.pack(index, status, score)
        conn.send_bytes(RESULT + body + reason.encode()[:MAX_REASON_BYTES])


def _limit_resources(memory_limit_mb: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_mb is not None:
        limit = memory_limit_mb * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)  # an unprivileged process cannot raise its hard limit
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _refuse_side_effects(event: str, args: tuple) -> None:
    if event in _FORBIDDEN_EVENTS:
        raise PermissionError(f"verifier workers may not perform {event}")
    if event == "open" and _opens_for_writing(args):
        raise PermissionError("verifier workers may not write files")


def _opens_for_writing(args: tuple) -> bool:
    _, mode, flags = args
    if isinstance(mode, str):
        return any(ch in mode for ch in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _exit_with_parent() -> None:
    """Exit when orphaned, even if the main thread is stuck in a long computation
    (the check runs again once the computation yields the GIL)."""
    parent = os.getppid()
    tick = threading.Event()  # never set: wait() is an interruptible one-second sleep

    def watch() -> None:
        while os.getppid() == parent:
            tick.wait(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
