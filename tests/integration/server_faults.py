"""Faults of a vLLM server fleet mid-run, for the server tests: a callback importable by class path
(``server_faults.KillServers``) that kills servers of the fleet the test registered (:data:`FLEET`) after one update
and starts them again after another; a run in another process names the servers' process groups instead."""

from __future__ import annotations

import os
import signal

import lightning as L

FLEET = None
"""The test's ``LocalFleet`` (set by the test before the run)."""


class KillServers(L.Callback):
    """kill -9 servers ``indices`` of :data:`FLEET` (their process groups), the process groups ``pids`` (a run in
    another process, where :data:`FLEET` is not set), or servers ``own`` of the run's own local fleet (``servers:
    local``), after update ``kill_step``; start :data:`FLEET`'s again on their ports after update ``restart_step``
    (waits until they answer; -1: never). On the run's first process only."""

    def __init__(self, indices: list[int] = (), kill_step: int = 0, restart_step: int = -1,
                 pids: list[int] = (), own: list[int] = ()) -> None:
        self.indices, self.kill_step, self.restart_step, self.pids = list(indices), kill_step, restart_step, list(pids)
        self.own = list(own)

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if not trainer.is_global_zero:
            return
        if trainer.global_step == self.kill_step:
            own = trainer.lightning_module.engine.fleet
            for pid in self.pids or [FLEET.servers[i].pid for i in self.indices] + [own.servers[i].pid
                                                                                    for i in self.own]:
                os.killpg(pid, signal.SIGKILL)
        if trainer.global_step == self.restart_step:
            for i in self.indices:
                FLEET.restart(i)
