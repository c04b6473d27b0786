"""Shared test set-up: no network, no seed leaking between tests."""

import importlib.util
import os

import pytest
from stand_in_vllm import stand_in_vllm  # noqa: F401 - the fixture, for every test folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` are skipped where vLLM is not installed (``make test-vllm`` runs them)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed: run `make test-vllm` (its own venv, .venv-vllm)")
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _reset_global_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's seed_everything exports PL_GLOBAL_SEED; a test must not inherit another's.
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny model folder built once per test session through the real save/load code."""
    from ggpo_lightning.tasks.tiny_model import build_tiny_model
    from ggpo_lightning.testing import TINY_TEST_MODEL

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", TINY_TEST_MODEL)


@pytest.fixture(scope="session")
def wide_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """The tiny test model with head size 32 (hidden 64, 2 heads), for vLLM: its CPU attention has no kernel
    for the tiny model's head size 16 ("Unsupported CPU attention configuration: head_dim=16")."""
    from dataclasses import replace

    from ggpo_lightning.tasks.tiny_model import build_tiny_model
    from ggpo_lightning.testing import TINY_TEST_MODEL

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wide", replace(TINY_TEST_MODEL, hidden_size=64))


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Qwen3-shaped model folder (Qwen3ForCausalLM, random weights) whose tokenizer carries Qwen3's own chat
    template (``tests/qwen3_model.py``): chat-template and first-run tests without downloads."""
    from qwen3_model import build_qwen3_model

    return build_qwen3_model(tmp_path_factory.mktemp("models") / "qwen3-tiny")


@pytest.fixture()
def tiny_lm(tiny_model_dir):
    """``(model, tokenizer)`` loaded fresh from the tiny model folder."""
    from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(tiny_model_dir, dtype="float32"), load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory):
    """Train/test JSONL of one-digit sums (40/12 prompts), for module-level training tests."""
    from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits

    directory = tmp_path_factory.mktemp("data")
    write_splits(ArithmeticTask(max_operand=9, ops="+"), directory, n_train=40, n_test=12, seed=0)
    return directory


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch):
    """``to_float64(module_or_model)`` for tests that compare two computations of one quantity: see
    ``float64_models`` (why float64, and the tolerance ``FLOAT64_TOLERANCE``)."""
    from float64_models import float64_norms, to_float64

    float64_norms(monkeypatch)
    return to_float64
