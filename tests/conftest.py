"""Shared test set-up: no network, no seed leaking between tests."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _reset_global_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's seed_everything exports PL_GLOBAL_SEED; a test must not inherit another's.
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
