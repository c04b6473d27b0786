"""One vLLM server as the fleet engine sees it: an explicit state and the transitions between states.

::

    unsynced --begin_push--> pushing --pushed--> serving --begin_push--> pushing ...
    serving --weights_changed--> unsynced                 (a LoRA run's base changed: push it again)
    any --failed--> out --answers_again--> back --begin_push--> resyncing --pushed--> serving (a re-sync)
    any --rank0_pushed--> serving, any --rank0_lost--> out     (trainer rank 0 pushed: its outcome, on the other ranks)

Each time a server is taken out its :attr:`FleetServer.epoch` grows: a reply to a request sent in an earlier epoch
(before the server was taken out) is discarded, whatever the server's state now.

Requests go to ``serving`` servers only. A server is *in the fleet* (:attr:`FleetServer.in_fleet`) while it answers
and was not taken out since its last push (``unsynced``, ``pushing``, ``serving``). A transition the table does not
name is a bug, raised as ``RuntimeError``; the ones below that keep the state are deliberate (e.g. a push that ends
after a request already took its server out leaves it out). Torch-free and vLLM-free.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FleetServer", "ServerState"]


class ServerState(enum.Enum):
    UNSYNCED = "unsynced"
    """Answers, and does not hold the weights of the latest push (new, or the base of a LoRA run changed)."""
    PUSHING = "pushing"
    """Its weights are being replaced: no request goes to it."""
    SERVING = "serving"
    """Holds the latest push: takes requests."""
    OUT = "out"
    """Failed (a request, a push, or a response from weights never pushed); probed until it answers again."""
    BACK = "back"
    """Answers again after failing; used once it received a push."""
    RESYNCING = "resyncing"
    """A server that came back, being pushed the weights."""


S = ServerState
TRANSITIONS: dict[str, dict[ServerState, ServerState]] = {
    "begin_push": {S.UNSYNCED: S.PUSHING, S.SERVING: S.PUSHING, S.BACK: S.RESYNCING},
    "pushed": {S.PUSHING: S.SERVING, S.RESYNCING: S.SERVING, S.OUT: S.OUT, S.BACK: S.BACK},
    "failed": {state: S.OUT for state in S},
    "answers_again": {S.OUT: S.BACK},
    "weights_changed": {S.SERVING: S.UNSYNCED, S.UNSYNCED: S.UNSYNCED, S.OUT: S.OUT, S.BACK: S.BACK},
    "rank0_pushed": {state: S.SERVING for state in S},
    "rank0_lost": {state: S.OUT for state in S},
}
"""For each transition, the state it leads to from each state it may start in."""


@dataclass
class FleetServer:
    """A server at ``url``, its :class:`ServerState` and what the engine keeps of it."""

    url: str
    state: ServerState = ServerState.UNSYNCED
    outstanding: int = 0
    """Requests sent to it and not answered yet."""
    last_error: str | None = None
    transfer: Any = None
    """vLLM's trainer-side transfer engine for this server (None until its first push, and after a failure)."""
    adapters: list[str] = field(default_factory=list)
    """LoRA adapters loaded on it, oldest first (``publishes_adapters``)."""
    adapter_uses: Counter[str] = field(default_factory=Counter)
    """Requests in flight on it, per adapter they name: an adapter is unloaded only when none names it."""
    epoch: int = 0
    """How many times it was taken out: a request's reply counts only if the epoch is the one it was sent in."""

    @property
    def usable(self) -> bool:
        """Requests may go to it."""
        return self.state is ServerState.SERVING

    @property
    def answering(self) -> bool:
        """Not taken out (or back since): a push may go to it."""
        return self.state is not ServerState.OUT

    @property
    def in_fleet(self) -> bool:
        """Answers and was not taken out since its last push (one in the middle of a push counts)."""
        return self.state in (ServerState.UNSYNCED, ServerState.PUSHING, ServerState.SERVING)

    def begin_push(self) -> None:
        """Its weights start changing: no request goes to it until :meth:`pushed`."""
        self._go("begin_push")

    def pushed(self) -> bool:
        """The push reached it; True when that was a re-sync (it had failed)."""
        resync = self.state is ServerState.RESYNCING
        self._go("pushed")
        if self.state is ServerState.SERVING:
            self.last_error = None
        return resync

    def failed(self, error: str) -> bool:
        """Taken out (a new :attr:`epoch`: replies to the requests sent before are discarded), ``error`` kept for the
        message that names it; True when it was not out already (the failure is news: a server that answers again
        may fail its re-sync too)."""
        news = self.state not in (ServerState.OUT, ServerState.BACK, ServerState.RESYNCING)
        self._go("failed")
        self.epoch += 1
        self.last_error = error
        return news

    def answers_again(self) -> None:
        """A server that was out answers its health check: it is used after its next push."""
        self._go("answers_again")

    def weights_changed(self) -> None:
        """The weights it holds are no longer the run's (a LoRA run's base changed): push it again before use."""
        self._go("weights_changed")

    def follow_rank0(self, holds_push: bool, error: str | None) -> None:
        """Trainer rank 0 pushed to the fleet (this is another rank): the server is used when rank 0's push reached
        it, else it is out with rank 0's ``error`` (probed, and used again after a later push that reaches it)."""
        if holds_push:
            self._go("rank0_pushed")
            self.last_error = None
        else:
            self._go("rank0_lost")
            self.last_error = error or "rank 0's weight push did not reach it"

    def _go(self, transition: str) -> None:
        target = TRANSITIONS[transition].get(self.state)
        if target is None:
            raise RuntimeError(f"vLLM server {self.url}: no transition {transition!r} from {self.state.value!r}")
        self.state = target
