"""Verifier health: a broken answer checker, or a run whose every answer scores 0, stops instead of training on.

A verifier plugin that raises, crashes its worker, returns a score outside [0, 1] or
hangs past its timeout scores 0.0 for that response (``ggpo_verifiers`` counts it as
``crashed`` or ``timeout``). One such check is an outcome; a verifier that fails most of
its checks step after step is a bug, and a run that trains on it learns nothing.
:class:`VerifierHealth` watches each step's counts and raises :class:`VerifierHealthError`
(the run saves a checkpoint, writes ``summary.json`` marked ``aborted`` and exits
non-zero), and warns once when waiting on the verifier takes a large share of a step.
A run whose responses all score 0 step after step (a working verifier, but answers in a
form it does not read, golds in the wrong form, or a starting model that never solves a
prompt) learns nothing from its rewards either: :class:`ZeroRewardError`, handled the same way.
Torch-free, Lightning-free.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ggpo_lightning.records.errors import RunAborted

__all__ = ["VerifierHealth", "VerifierHealthConfig", "VerifierHealthError", "ZeroRewardError"]

log = logging.getLogger(__name__)


class VerifierHealthError(RunAborted):
    """The verifier failed too many checks (``model.verifier_health``)."""


class ZeroRewardError(RunAborted):
    """Every response scored 0 for ``model.verifier_health.max_zero_reward_steps`` steps in a row."""


@dataclass
class VerifierHealthConfig:
    """When a failing verifier aborts the run, and when a slow one is warned about."""

    max_failed_share: float = 0.5
    """Abort when crashed + timed-out checks are more than this share of a step's checks ..."""
    patience: int = 3
    """... for this many steps in a row (1 = the first such step)."""
    warn_wait_share: float = 0.25
    """Warn once when a step with timed-out checks spent more than this share of its time waiting on the verifier."""
    max_zero_reward_steps: int | None = 20
    """Abort when every response (of every process) scored 0 in this many steps in a row: the rewards then teach
    nothing. Counted over steps that ran verifier checks (offline replay, whose rewards were scored before training,
    is not watched). None: never (a benchmark on random weights)."""
    enabled: bool = True
    """False: never abort, on failed checks or zero rewards (the counts are still logged as ``train/verifier/*``)."""

    def errors(self) -> list[str]:
        errors = []
        if not 0 <= self.max_failed_share < 1:
            errors.append(f"model.verifier_health.max_failed_share must be in [0, 1), got {self.max_failed_share}")
        if self.patience < 1:
            errors.append(f"model.verifier_health.patience must be >= 1, got {self.patience}")
        if not 0 < self.warn_wait_share <= 1:
            errors.append(f"model.verifier_health.warn_wait_share must be in (0, 1], got {self.warn_wait_share}")
        if self.max_zero_reward_steps is not None and self.max_zero_reward_steps < 1:
            errors.append("model.verifier_health.max_zero_reward_steps must be None or >= 1, got "
                          f"{self.max_zero_reward_steps}")
        return errors


class VerifierHealth:
    """Checks each step's (and each evaluation's) verifier counts against :class:`VerifierHealthConfig`.

    ``counts`` are ``VerifierStats.as_dict()`` values (``crashed``, ``timeout``, ``total``),
    summed over ranks, so every process decides the same.
    """

    def __init__(self, config: VerifierHealthConfig) -> None:
        self.config = config
        self.streak = 0  # steps in a row over max_failed_share
        self.zero_streak = 0  # steps in a row whose responses all scored 0
        self.warned_wait = False
        self._step_start = time.perf_counter()

    def check_step(self, counts: Mapping[str, float], step: int, verify_seconds: float, reward: float) -> None:
        """After one step's rollout; ``reward`` is the mean score of the step's responses over every process (0 only
        when each scored 0). Raises VerifierHealthError on the ``patience``-th bad step in a row, ZeroRewardError on
        the ``max_zero_reward_steps``-th step in a row at reward 0."""
        now, start = time.perf_counter(), self._step_start
        self._step_start = now
        failed, total = counts["crashed"] + counts["timeout"], counts["total"]
        if total and counts["timeout"] and not self.warned_wait and verify_seconds > self.config.warn_wait_share * (
                now - start):
            self.warned_wait = True
            log.warning("!" * 72 + "\nstep %d: %.1f s of %.1f s waited on the verifier, %d check(s) timed out: a "
                        "verifier that hangs costs its full timeout per check. Fix the verifier or lower "
                        "model.verifier_timeout (warned once)\n" + "!" * 72, step, verify_seconds, now - start,
                        counts["timeout"])
        if not self.config.enabled or not total:
            return
        self.streak = self.streak + 1 if failed > self.config.max_failed_share * total else 0
        if self.streak >= self.config.patience:
            raise VerifierHealthError(
                f"the verifier failed {failed:.0f} of {total:.0f} checks at step {step} ({counts['crashed']:.0f} "
                f"crashed, {counts['timeout']:.0f} timed out), over model.verifier_health.max_failed_share="
                f"{self.config.max_failed_share} for {self.streak} step(s) in a row: rewards would be 0. Run "
                "`ggpo verifiers` on a sample answer to see the error; raise model.verifier_timeout for slow checks; "
                "model.verifier_health.enabled: false trains on regardless")
        self.zero_streak = self.zero_streak + 1 if reward == 0 else 0
        if self.config.max_zero_reward_steps is not None and self.zero_streak >= self.config.max_zero_reward_steps:
            raise ZeroRewardError(
                f"every response scored 0 in the {self.zero_streak} steps up to step {step}: the rewards teach "
                "nothing. Look at the answers (the run's samples file; `ggpo verifiers` on one of them), the gold "
                "answers' form and the prompt template, or the starting model (a warm-up at 0% accuracy); "
                "model.verifier_health.max_zero_reward_steps: null trains on regardless")

    def check_evaluation(self, counts: Mapping[str, float], what: str) -> None:
        """After an evaluation: every check crashed or timed out means the accuracy is not a measurement."""
        failed, total = counts["crashed"] + counts["timeout"], counts["total"]
        if self.config.enabled and total and failed == total:
            raise VerifierHealthError(
                f"every one of the {total:.0f} verifier checks of the {what} crashed or timed out "
                f"({counts['crashed']:.0f} crashed, {counts['timeout']:.0f} timed out): the accuracy would read 0. "
                "Run `ggpo verifiers` on a sample answer to see the error; model.verifier_health.enabled: false "
                "trains on regardless")
