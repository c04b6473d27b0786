"""In-flight weight updates, emulated on the HF engine (``model.rollout.in_flight_updates: keep`` with ``engine: hf``):
what a fleet of inference servers that pauses with ``keep`` does to the responses it is generating when new weights
arrive, in one process and reproducibly.

A sync does not load the learner's weights at once: they are copied aside, and the next rollout starts on the
engine's old weights and swaps the new ones in before one decoding step, drawn at random. Every response still
generating then has its first tokens from one version and the rest from the next; the keys and values already in
its cache stay as the old weights computed them, as on a server. Each response is tagged ``[first, last]``
(:attr:`~ggpo_lightning.rollouts.protocol.Generation.versions`), its group's behavior version is the oldest ``first``,
and the behavior log-probs are each token's under the weights that sampled it.

The step is ``1 + floor(u * (L - 1))`` with ``u`` uniform in [0, 1) and ``L`` the mean length of the previous
rollout's responses (at least 2), so it falls inside a typical response: about half of the responses straddle
the two versions when lengths are alike. ``u`` is drawn from a generator seeded by the run's seed and the new
version, so a resumed run swaps where the uninterrupted one did. Weights that arrive before any rollout (the run's
start, a resume's re-sync) are loaded at once: nothing is in flight then.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.protocol import Generation, Weights, weight_pairs
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine

__all__ = ["InFlightUpdates"]

_PENDING = "in_flight.pending."
_PENDING_VERSION = "in_flight.pending_version"
_MEAN_LENGTH = "in_flight.mean_length"


class InFlightUpdates:
    """The :class:`~ggpo_lightning.rollouts.protocol.RolloutEngine` protocol over an :class:`HFGenerateEngine` with a
    private model, whose syncs land in the middle of the next rollout (module docstring).

    Counts, per rollout (:meth:`take_metrics`): ``in_flight_straddling``, the share of responses with tokens of two
    versions, and ``in_flight_swap_step``, the decoding step the weights were swapped before (absent without a swap).
    """

    def __init__(self, engine: HFGenerateEngine, seed: int) -> None:
        if engine.shared:
            raise ValueError("in-flight updates need an engine with its own copy of the model, not the learner")
        self.engine = engine
        self.seed = seed
        self.pending: tuple[dict[str, Tensor], int] | None = None  # weights copied aside and their version
        self.mean_length: float | None = None  # of the last rollout's responses; None before the first rollout
        self.rolled_out = False  # a rollout ran since the start (or a resume's re-sync): a sync can land inside one
        self._swap_at: int | None = None  # the decoding step of the current call's swap
        self._metrics: dict[str, float] = {}

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def model(self) -> torch.nn.Module:
        """The engine's model (what :func:`~ggpo_lightning.rollouts.protocol.autocast_device` looks at)."""
        return self.engine.model

    def load_weights(self, learner: Weights, version: int) -> None:
        """Hold ``learner``'s weights (copied: the learner trains on before the swap) for the next rollout to swap
        in; loaded at once before the first rollout or when weights are already held (two syncs without a rollout
        between them: the older one is then no longer in flight)."""
        if not self.rolled_out:
            self.engine.load_weights(learner, version)
            return
        self._apply_pending()
        self.pending = ({name: tensor.detach().clone() for name, tensor in weight_pairs(learner)}, version)

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        if self.pending is not None:
            length = max(2.0, self.mean_length or 2.0)
            draw = random.Random(f"{self.seed}:{self.pending[1]}").random()
            self._swap_at = 1 + int(draw * (length - 1))
            self.engine.before_step = self._before_step
        swap_at = self._swap_at
        try:
            generations = self.engine.generate(prompt_ids, n, sampling)
        finally:
            self.engine.before_step, self._swap_at = None, None
        responses = [ids for g in generations for ids in g.response_ids]
        self.mean_length = sum(map(len, responses)) / max(1, len(responses))
        self.rolled_out = True
        self._metrics = {}
        if swap_at is not None:
            straddling = sum(first < last for g in generations for first, last in g.versions)
            self._metrics = {"in_flight_straddling": straddling / max(1, len(responses)),
                             "in_flight_swap_step": float(swap_at)}
        self._apply_pending()  # every response finished before the drawn step: the weights land after the rollout
        return generations

    def _before_step(self, t: int) -> int | None:
        """The decode loop's hook: the held weights swapped in before step ``_swap_at`` (of the call's first chunk
        of ``generation_batch_size`` rows; the later chunks start on them)."""
        if self.pending is None or t != self._swap_at:
            return None
        self._apply_pending()
        return self.engine.version

    def _apply_pending(self) -> None:
        if self.pending is not None:
            state, version = self.pending
            self.pending = None
            self.engine.load_weights(state, version)

    def take_metrics(self) -> dict[str, float]:
        """The last rollout's counts (class docstring), then cleared."""
        metrics, self._metrics = self._metrics, {}
        return metrics

    def to(self, device: torch.device | str) -> InFlightUpdates:
        self.engine.to(device)
        return self

    def unshare(self) -> None:
        """The engine never shares the learner's tensors (checked at construction)."""

    def state_dict(self, step: int) -> dict[str, Tensor] | None:
        """The engine's weights (None where a resume rebuilds them), plus the weights held for the next rollout and
        the last rollout's mean length: what the next swap depends on."""
        state = self.engine.state_dict(step)
        extra: dict[str, Tensor] = {}
        if self.mean_length is not None:
            extra[_MEAN_LENGTH] = torch.tensor(self.mean_length, dtype=torch.float64)
        if self.pending is not None:
            extra.update({_PENDING + name: tensor for name, tensor in self.pending[0].items()})
            extra[_PENDING_VERSION] = torch.tensor(self.pending[1])
        return state if not extra else {**(state or {}), **extra}

    def load_state_dict(self, state: dict[str, Tensor] | None, version: int) -> bool:
        state = dict(state or {})
        mean_length = state.pop(_MEAN_LENGTH, None)
        pending_version = state.pop(_PENDING_VERSION, None)
        pending = {name.removeprefix(_PENDING): state.pop(name) for name in list(state) if name.startswith(_PENDING)}
        self.pending = None if pending_version is None else (pending, int(pending_version))
        self.mean_length = None if mean_length is None else float(mean_length)
        resync = self.engine.load_state_dict(state or None, version)
        # a re-sync brings the weights the engine held at the checkpoint: loaded at once, not swapped in
        self.rolled_out = self.mean_length is not None and not resync
        return resync

    def close(self) -> None:
        self.engine.close()
