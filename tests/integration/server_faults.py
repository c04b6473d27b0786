"""Faults of a vLLM server fleet mid-run, for the server tests: a callback importable by class path
(``server_faults.KillServers``) that kills servers of the fleet the test registered (:data:`FLEET`) after one update
and starts them again after another. In-process runs only (the fleet is the test's)."""

from __future__ import annotations

import os
import signal

import lightning as L

FLEET = None
"""The test's ``LocalFleet`` (set by the test before the run)."""


class KillServers(L.Callback):
    """kill -9 servers ``indices`` (their process groups) after update ``kill_step``; start them again on their ports
    after update ``restart_step`` (waits until they answer; -1: never)."""

    def __init__(self, indices: list[int], kill_step: int, restart_step: int = -1) -> None:
        self.indices, self.kill_step, self.restart_step = indices, kill_step, restart_step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.kill_step:
            for i in self.indices:
                os.killpg(FLEET.servers[i].pid, signal.SIGKILL)
        if trainer.global_step == self.restart_step:
            for i in self.indices:
                FLEET.restart(i)
