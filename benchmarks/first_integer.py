"""The reward of the vs-TRL benchmark (``workload.py``) as a verifier: 1 if the first integer in the response equals
the gold.

Both workers score with it, so both systems learn from the same reward: ``ggpo_worker.py``
gives it to ``ggpo-train`` (``model.verifier.class_path: first_integer.FirstIntegerVerifier``),
``trl_worker.py`` wraps it as TRL's reward function. The ``numeric`` verifier differs: it
reads the *last* number of a response.
"""

from __future__ import annotations

import re

from ggpo_verifiers import Verifier

_INT_RE = re.compile(r"-?\d+")


class FirstIntegerVerifier(Verifier):
    """1.0 if the first integer in the response equals the integer gold, else 0.0 (None: no integer)."""

    isolated = False  # one bounded regex over a short string: nothing to sandbox

    def extract(self, response: str) -> str | None:
        match = _INT_RE.search(response)
        return None if match is None else match.group()

    def check(self, answer: str, gold: str) -> bool:
        return int(answer) == int(gold)
