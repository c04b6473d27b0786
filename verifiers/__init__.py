"""ggpo_verifiers: safe, fast answer checkers ("verifiers") for RL with verifiable rewards.

Model outputs are untrusted: the checks never evaluate them as code, run in worker
processes with a hard wall-clock timeout and a memory cap, and turn every failure into a
0.0 score that is counted in ``stats``. Importing this package loads neither torch nor
sympy.

    from ggpo_verifiers import get_verifier

    with get_verifier("math", timeout=5.0, workers=4) as verifier:
        golds = [gold_from_solution(text) for text in gold_fields]  # at data-loading time
        verifier.validate_golds(golds)           # (solution texts are accepted too)
        rewards = verifier.score_batch(responses, golds)
        metrics = verifier.reset_stats().as_dict(prefix="verifier/")

Built-ins: ``math``, ``exact``, ``numeric``. Third-party verifiers subclass ``Verifier``
and declare an entry point in the group ``ggpo.verifiers``; see ``verifiers/README.md``.
"""

from ggpo_verifiers.base import GoldAnswerError, Outcome, Status, Verifier, VerifierStats
from ggpo_verifiers.exact import ExactVerifier, NumericVerifier
from ggpo_verifiers.extract import gold_from_solution
from ggpo_verifiers.math import MathVerifier
from ggpo_verifiers.pool import WorkerStartupError
from ggpo_verifiers.registry import (
    ENTRY_POINT_GROUP,
    UnknownVerifierError,
    available_verifiers,
    get_verifier,
    register_verifier,
    verifier_class,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ExactVerifier",
    "GoldAnswerError",
    "MathVerifier",
    "NumericVerifier",
    "Outcome",
    "Status",
    "UnknownVerifierError",
    "Verifier",
    "VerifierStats",
    "WorkerStartupError",
    "available_verifiers",
    "get_verifier",
    "gold_from_solution",
    "register_verifier",
    "verifier_class",
]
