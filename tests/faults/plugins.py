"""Broken verifier plugins for the fault tests, importable by class path (``plugins.Raises``) in the trainer and
in the verifier's worker processes (tests put this folder on PYTHONPATH)."""

from __future__ import annotations

import os
import signal
import time

from ggpo_verifiers import Verifier


class Raises(Verifier):
    def check(self, answer: str, gold: str) -> bool:
        raise RuntimeError("plugin bug")


class Segfaults(Verifier):
    def check(self, answer: str, gold: str) -> bool:
        os.kill(os.getpid(), signal.SIGSEGV)
        return True


class OutOfRange(Verifier):
    def check(self, answer: str, gold: str) -> float:
        return 2.0


class NeverRight(Verifier):
    """A working checker whose golds no answer ever matches (as when the golds are in a form the answers never take)."""

    def check(self, answer: str, gold: str) -> bool:
        return False


class Hangs(Verifier):
    def check(self, answer: str, gold: str) -> bool:
        time.sleep(3600)
        return True
