"""The ``Verifier`` contract: score untrusted model responses against gold answers.

A verifier splits its work in two:

* ``extract(response)`` runs in the calling (trainer) process. It must be cheap,
  bounded-time string work (find the final answer, cap its size); ``None`` means
  "no answer", scored 0.0 and counted as unparseable.
* ``check(answer, gold)`` runs in a worker process (``isolated = True``, the default),
  under a hard wall-clock timeout and a memory cap, with process creation, network and
  file writes refused (see ``ggpo_verifiers.worker``). It may be slow, hang, crash or
  raise: the pool kills and replaces the worker and the check scores 0.0. It returns
  True/False, a score in [0, 1], or None when the answer cannot be parsed.

``score``/``score_batch`` never raise because of response content. Verdicts for
repeated (gold, answer) pairs come from an in-memory cache. Outcome counts accumulate in
``stats`` for logging. Gold answers are dataset input: ``validate_gold(s)`` raises
``GoldAnswerError`` for one the verifier cannot use, so the data loader can name the row.

A verifier object is picklable (its worker pool is not pickled; a copy, e.g. in a
DataLoader worker, starts its own workers on first use) and safe to call from any
thread (concurrent batches take turns on the workers). ``close()`` stops the workers; a
later call starts new ones. Use it as a context manager to close it on exit.
"""

from __future__ import annotations

import abc
import logging
import os
import pickle
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ggpo_verifiers.pool import WorkerPool
from ggpo_verifiers.records import GoldAnswerError, Outcome, Status

logger = logging.getLogger(__name__)


# Verdicts that depend only on (gold, answer): safe to cache. A timeout may be load: cached
# only when the same pair times out again (TIMEOUTS_BEFORE_CACHING).
_CACHEABLE = frozenset({Status.CORRECT, Status.WRONG, Status.UNPARSEABLE, Status.BAD_GOLD})
TIMEOUTS_BEFORE_CACHING = 2


@dataclass
class VerifierStats:
    """Outcome counts since the last ``reset_stats()``, one per scored response.

    ``cache_hits`` counts responses whose verdict came from the cache (or a duplicate
    earlier in the same batch) instead of a worker. ``unboxed`` counts responses without
    a ``\\boxed{}`` answer (scored by a fallback rule, or unparseable), whatever their
    outcome: a high share means the prompt template does not ask for a box.
    """

    correct: int = 0
    wrong: int = 0
    unparseable: int = 0
    timeout: int = 0
    crashed: int = 0
    bad_gold: int = 0
    cache_hits: int = 0
    unboxed: int = 0

    @property
    def total(self) -> int:
        """Number of scored responses."""
        return (
            self.correct + self.wrong + self.unparseable + self.timeout + self.crashed + self.bad_gold
        )

    @property
    def accuracy(self) -> float:
        """Fraction of scored responses that were correct (0.0 when none were scored)."""
        return self.correct / self.total if self.total else 0.0

    @property
    def unboxed_share(self) -> float:
        """Fraction of scored responses without a box (0.0 when none were scored)."""
        return self.unboxed / self.total if self.total else 0.0

    def add(self, status: Status) -> None:
        """Count one outcome."""
        field = status.name.lower()
        setattr(self, field, getattr(self, field) + 1)

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Counts plus ``total``, ``accuracy`` and ``unboxed_share``, keys prefixed (e.g.
        ``"verifier/"``)."""
        values = {
            **asdict(self),
            "total": self.total,
            "accuracy": self.accuracy,
            "unboxed_share": self.unboxed_share,
        }
        return {prefix + key: value for key, value in values.items()}


def run_check(verifier: Verifier, method: str, args: tuple[str, ...]) -> tuple[Status, float, str]:
    """Run one ``check``/``check_gold`` call and turn any result into (status, score,
    reason). Never raises for an ordinary exception: a failing check is an outcome."""
    try:
        if method == "check_gold":
            verifier.check_gold(*args)
            return Status.CORRECT, 1.0, ""
        return (*_interpret(verifier.check(*args)), "")
    except GoldAnswerError as err:
        return Status.BAD_GOLD, 0.0, err.reason
    except Exception as err:  # the check is untrusted work: any failure is an outcome
        if method == "check_gold":
            return Status.BAD_GOLD, 0.0, f"check_gold raised {type(err).__name__}"
        return Status.CRASHED, 0.0, ""


def _interpret(value: bool | float | None) -> tuple[Status, float]:
    if value is None:
        return Status.UNPARSEABLE, 0.0
    score = float(value)
    if not 0.0 <= score <= 1.0:  # also rejects NaN: a buggy check must not emit rewards
        return Status.CRASHED, 0.0
    return (Status.CORRECT if score > 0.0 else Status.WRONG), score


class Verifier(abc.ABC):
    """Base class of answer checkers; subclass it and implement ``check``.

    Args:
        timeout: Hard wall-clock limit in seconds for one ``check`` in a worker; a
            check that takes longer is killed and scores 0.0 (counted as ``timeout``).
        workers: Number of worker processes (default: min(4, CPU count)).
        max_tasks_per_worker: Replace a worker after this many checks (sympy's caches
            grow without bound).
        memory_limit_mb: Address-space cap of each worker (RLIMIT_AS); None for no cap.
        cache_size: Number of (answer, gold) verdicts kept across batches; 0 disables
            that cache (identical pairs within one batch are always checked once).
            Crashes are never cached; a timeout is cached once the same pair has timed
            out twice (one timeout may be machine load; a pair that keeps timing out,
            such as a deeply nested expression repeated in every group, would otherwise
            cost the full timeout each time).
    """

    name: ClassVar[str] = ""
    """Registry name, set by ``register_verifier`` or the entry point that loaded it."""

    isolated: ClassVar[bool] = True
    """Run ``check`` in worker processes. Set False only for checks that are bounded-time
    pure-Python string work, which cannot hang or execute anything."""

    allow_side_effects: ClassVar[bool] = False
    """Let checks spawn processes, open sockets and write files in the worker. Leave
    False unless the check needs them (e.g. it runs code in a sandbox of its own)."""

    def __init__(
        self,
        *,
        timeout: float = 5.0,
        workers: int | None = None,
        max_tasks_per_worker: int = 1000,
        memory_limit_mb: int | None = 1024,
        cache_size: int = 50_000,
    ) -> None:
        _require(timeout > 0, "timeout", timeout, "a positive number of seconds")
        _require(workers is None or workers >= 1, "workers", workers, "at least 1")
        _require(max_tasks_per_worker >= 1, "max_tasks_per_worker", max_tasks_per_worker, ">= 1")
        _require(
            memory_limit_mb is None or memory_limit_mb >= 64,
            "memory_limit_mb",
            memory_limit_mb,
            "None or at least 64",
        )
        _require(cache_size >= 0, "cache_size", cache_size, ">= 0")
        self.timeout = float(timeout)
        self.workers = workers or min(4, os.cpu_count() or 1)
        self.max_tasks_per_worker = max_tasks_per_worker
        self.memory_limit_mb = memory_limit_mb
        self.cache_size = cache_size
        self._init_runtime()

    # ------------------------------------------------------------------ hooks

    def extract(self, response: str) -> str | None:
        """The part of ``response`` to check, or None if it has no answer. Runs in the
        caller's process on untrusted text: keep it cheap and bounded. Default: all."""
        return response

    @abc.abstractmethod
    def check(self, answer: str, gold: str) -> bool | float | None:
        """Whether ``answer`` (from ``extract``) matches ``gold``: True/False, a score
        in [0, 1], or None if the answer cannot be parsed. Raise ``GoldAnswerError`` if
        the gold is unusable. Runs in a worker process when ``isolated``."""

    def unboxed(self, response: str, answer: str | None) -> bool:
        """Whether ``response`` (whose ``extract`` gave ``answer``) has no boxed answer;
        counted in ``stats.unboxed``. Runs in the caller: keep it cheap. Default: False
        (a verifier that does not look for boxes)."""
        return False

    def check_gold(self, gold: str) -> None:
        """Raise ``GoldAnswerError`` if ``gold`` cannot be used. Runs where ``check``
        does. Default: reject empty golds."""
        if not gold.strip():
            raise GoldAnswerError(gold, "it is empty")

    def warmup(self) -> None:
        """Called once in each new worker before it takes tasks (and before its memory
        cap applies): import and initialize heavy dependencies here."""

    # ------------------------------------------------------------------ scoring

    def score(self, response: str, gold: str) -> float:
        """Score one response: 1.0 if its answer matches ``gold``, else 0.0."""
        return self.score_batch([response], [gold])[0]

    def score_batch(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]:
        """Scores of ``responses[i]`` against ``golds[i]``, checked in parallel."""
        return [outcome.score for outcome in self.evaluate_batch(responses, golds)]

    def evaluate_batch(self, responses: Sequence[str], golds: Sequence[str]) -> list[Outcome]:
        """Like ``score_batch`` but with the status of each score."""
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} golds")
        outcomes, pending = self._extract_answers(responses, golds)
        verdicts = self._cached(pending)
        fresh = self._run("check", [key for key in pending if key not in verdicts])
        self._record(outcomes, pending, verdicts, fresh)
        bad_golds = sum(outcome.status is Status.BAD_GOLD for outcome in outcomes)
        if bad_golds:
            logger.warning(
                "%s verifier: %d response(s) scored 0.0 because their gold answer is unusable; "
                "call validate_golds() when loading the data to find the rows",
                self.name or type(self).__name__,
                bad_golds,
            )
        return outcomes

    def validate_gold(self, gold: str) -> None:
        """Raise ``GoldAnswerError`` if ``gold`` cannot be used by this verifier."""
        try:
            self.validate_golds([gold])
        except GoldAnswerError as err:
            raise GoldAnswerError(err.gold, err.reason) from None

    def validate_golds(self, golds: Sequence[str]) -> None:
        """Check golds in parallel; raise ``GoldAnswerError`` for the first unusable one,
        with ``index`` set to its position in ``golds``."""
        for i, gold in enumerate(golds):
            if not isinstance(gold, str):
                raise GoldAnswerError(repr(gold), f"it is a {type(gold).__name__}, not a string", i)
        results = self._run("check_gold", [(gold,) for gold in dict.fromkeys(golds)])
        for i, gold in enumerate(golds):
            status, _, reason = results[(gold,)]
            if status is Status.TIMEOUT:
                raise GoldAnswerError(gold, f"checking it took longer than {self.timeout:g} s", i)
            if status is not Status.CORRECT:
                raise GoldAnswerError(gold, reason or "the verifier worker crashed on it", i)

    # ------------------------------------------------------------------ state

    @property
    def stats(self) -> VerifierStats:
        """A snapshot of the outcome counts since the last ``reset_stats()``."""
        with self._lock:
            return VerifierStats(**asdict(self._stats))

    def reset_stats(self) -> VerifierStats:
        """Zero the counts; return the counts before the reset."""
        with self._lock:
            before, self._stats = self._stats, VerifierStats()
            return before

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for runtime in ("_lock", "_pool", "_cache", "_stats", "_timeouts"):
            state.pop(runtime, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, timeout={self.timeout:g}, workers={self.workers})"

    # ------------------------------------------------------------------ internals

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._stats = VerifierStats()
        self._cache: OrderedDict[tuple[str, ...], Outcome] = OrderedDict()
        self._timeouts: dict[tuple[str, ...], int] = {}  # timeouts per pair not yet cached
        self._pool: WorkerPool | None = None

    def _extract_answers(
        self, responses: Sequence[str], golds: Sequence[str]
    ) -> tuple[list[Outcome], dict[tuple[str, ...], list[int]]]:
        """Outcomes of responses without an answer (placeholders elsewhere), and the
        indices of the others grouped by their (answer, gold) pair. Counts unboxed
        responses."""
        outcomes = [Outcome(0.0, Status.UNPARSEABLE)] * len(responses)
        pending: dict[tuple[str, ...], list[int]] = {}  # (answer, gold) -> indices
        unboxed = 0
        for i, (response, gold) in enumerate(zip(responses, golds)):
            _require_str(response, "response", i)
            _require_str(gold, "gold", i)
            try:
                answer = self.extract(response)
                unboxed += self.unboxed(response, answer)
            except Exception:  # a plugin's extract failing on odd text is an outcome
                outcomes[i] = Outcome(0.0, Status.CRASHED)
                continue
            if answer is not None:
                pending.setdefault((answer, gold), []).append(i)
        with self._lock:
            self._stats.unboxed += unboxed
        return outcomes, pending

    def _record(
        self,
        outcomes: list[Outcome],
        pending: dict[tuple[str, ...], list[int]],
        verdicts: dict[tuple[str, ...], Outcome],
        fresh: dict[tuple[str, ...], tuple[Status, float, str]],
    ) -> None:
        """Fill ``outcomes`` from cached and fresh verdicts; update cache and stats."""
        with self._lock:
            for key, (status, score, _) in fresh.items():
                verdicts[key] = Outcome(score, status)
                if status is Status.TIMEOUT:
                    self._timeouts[key] = self._timeouts.get(key, 0) + 1
                repeated_timeout = self._timeouts.get(key, 0) >= TIMEOUTS_BEFORE_CACHING
                if (status in _CACHEABLE or repeated_timeout) and self.cache_size:
                    self._timeouts.pop(key, None)
                    self._cache[key] = verdicts[key]
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
            for key, indices in pending.items():
                for i in indices:
                    outcomes[i] = verdicts[key]
            self._stats.cache_hits += sum(map(len, pending.values())) - len(fresh)
            for outcome in outcomes:
                self._stats.add(outcome.status)

    def _cached(self, pending: dict[tuple[str, ...], list[int]]) -> dict[tuple[str, ...], Outcome]:
        with self._lock:
            hits = {key: self._cache[key] for key in pending if key in self._cache}
            for key in hits:
                self._cache.move_to_end(key)
            return hits

    def _run(self, method: str, calls: list[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[Status, float, str]]:
        """Run ``method`` on each distinct argument tuple; map arguments to results."""
        if not calls:
            return {}
        if not self.isolated:
            return {args: run_check(self, method, args) for args in calls}
        results = self._worker_pool().run([(method, args) for args in calls])
        return dict(zip(calls, results))

    def _worker_pool(self) -> WorkerPool:
        with self._lock:
            if self._pool is not None and not self._pool.usable_here():
                self._pool = None  # inherited through fork: those workers are the parent's
            if self._pool is None:
                self._pool = WorkerPool(
                    pickle.dumps(self),
                    workers=self.workers,
                    timeout=self.timeout,
                    max_tasks_per_worker=self.max_tasks_per_worker,
                    memory_limit_mb=self.memory_limit_mb,
                )
            return self._pool


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"verifier argument {name}={value!r} is invalid: expected {expected}")


def _require_str(value: object, what: str, index: int) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} #{index} is a {type(value).__name__}, expected str")


__all__ = [
    "GoldAnswerError",
    "Outcome",
    "Status",
    "Verifier",
    "VerifierStats",
    "run_check",
]
