"""Fixtures of the verifier tests. Pools live for the whole session: starting a worker
costs about half a second, and the tests are meant to stay fast on two cores."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ggpo_verifiers import MathVerifier

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def math_verifier() -> Iterator[MathVerifier]:
    """The default math verifier, with a generous timeout so a loaded CI machine does
    not turn a correct answer into a timeout."""
    with MathVerifier(timeout=10.0, workers=2) as verifier:
        yield verifier


@pytest.fixture(scope="session")
def dos_verifier() -> Iterator[MathVerifier]:
    """A math verifier with a short timeout and no cache, for inputs built to hang."""
    with MathVerifier(timeout=1.0, workers=2, cache_size=0) as verifier:
        yield verifier


@pytest.fixture(scope="session")
def hostile_module():
    """``hostile_verifiers`` (test verifiers that misbehave on purpose), importable here
    and, through the copied ``sys.path``, in worker processes."""
    path = str(FIXTURES / "hostile")
    sys.path.insert(0, path)
    import hostile_verifiers

    yield hostile_verifiers
    sys.path.remove(path)
