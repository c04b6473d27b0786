"""Ends a local server's whole process tree when the process that started it dies, however it dies (``kill -9``
included): a small watcher process per server (:func:`watch_command`), started by
:class:`~ggpo_lightning.rollouts.fleet.launcher.LocalServer`.

Why a process: vLLM's server spawns an engine core and workers, which ``PR_SET_PDEATHSIG`` on the server would not
reach (it is cleared at fork), and which outlive a killed trainer (seen: 8 processes a minute later). The watcher runs
in a session of its own (a signal to the trainer's process group, such as a terminal's Ctrl-C, does not reach it),
polls its parent every :data:`POLL_SECONDS`, and once the parent is gone (it was re-parented) ends the server's
process group (the server leads it: ``start_new_session``, and vLLM's children stay in it): SIGTERM, then SIGKILL
after :data:`TERM_SECONDS`. It exits by itself once the group is gone (the server stopped normally).

Run as a script (``python reaper.py PGID PARENT_PID``): it imports nothing of the package, so it starts in tens of
milliseconds.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_SECONDS = 0.2
"""How often the watcher checks its parent and the group."""
TERM_SECONDS = 5.0
"""How long the group has between SIGTERM and SIGKILL."""


def watch_command(pgid: int) -> list[str]:
    """The argv of a watcher for the process group ``pgid``, whose parent is this process."""
    return [sys.executable, str(Path(__file__).resolve()), str(pgid), str(os.getpid())]


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_group(pgid: int, term_seconds: float = TERM_SECONDS) -> None:
    """SIGTERM to the group ``pgid``, then SIGKILL to what is left after ``term_seconds``."""
    for sig, wait in ((signal.SIGTERM, term_seconds), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)


def watch(pgid: int, parent: int) -> None:
    """Wait until ``parent`` is no longer this process's parent (it died) or the group ``pgid`` is gone; in the first
    case end the group."""
    for name in ("SIGINT", "SIGHUP"):  # a terminal's signals are the trainer's to handle
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    while os.getppid() == parent:
        if not group_alive(pgid):
            return
        time.sleep(POLL_SECONDS)
    end_group(pgid)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
