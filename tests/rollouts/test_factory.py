"""make_engine: the one place an engine is chosen from the recipe."""

from __future__ import annotations

import pytest
import torch

from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.rollouts.hf.child_process import ChildProcessEngine
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine
from ggpo_lightning.rollouts.factory import make_engine
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine


@pytest.mark.parametrize("settings,lora,kind,shares", [
    (dict(sync_every=1), False, HFGenerateEngine, True),  # an exact copy at every rollout: the learner itself
    (dict(sync_every=2), False, HFGenerateEngine, False),  # stale between syncs: its own copy
    (dict(sync_every=1), True, HFGenerateEngine, False),  # the adapter is merged at syncs
    (dict(sync_every=1, dtype="bfloat16"), False, HFGenerateEngine, False),  # another precision
    (dict(sync_every=1, schedule="async", async_worker="thread"), False, HFGenerateEngine, False),
    (dict(sync_every=1, schedule="async"), False, ChildProcessEngine, False),  # generation in a child process
])
def test_the_engine_follows_the_recipe(tiny_model_dir, settings, lora, kind, shares):
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32)
    engine = make_engine(model, load_tokenizer(str(tiny_model_dir)), RolloutConfig(**settings), str(tiny_model_dir),
                         lora=lora, record_logprobs=True)
    try:
        assert type(engine) is kind and isinstance(engine, RolloutEngine)
        assert (engine.model is model) == shares and engine.shared == shares
        expected = torch.bfloat16 if settings.get("dtype") else torch.float32
        assert next(engine.model.parameters()).dtype == expected and engine.record_logprobs
    finally:
        engine.close()
