"""A micro-batched run trains as the single-pass run: the same losses and the same weights at the same seed, down
to a budget smaller than one group; gradient clipping sees the accumulated gradients."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from ggpo_lightning.core.microbatch import MicroBatchConfig
from ggpo_lightning.core.objectives import ObjectiveConfig

from training_runs import fit, make_data, make_module


class Record(L.Callback):
    def __init__(self) -> None:
        self.losses, self.first_update = [], None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(trainer.callback_metrics["train/loss"]))
        if trainer.global_step == 1:
            self.first_update = {n: p.detach().clone() for n, p in pl_module.learner.named_parameters()}


def run(tiny_model_dir, data_dir, name, max_tokens, **trainer_kwargs) -> Record:
    torch.manual_seed(0)
    # the quickstart's optimizer: Adam's first step is lr * g / (|g| + eps), so an lr of 1e-2 would turn rounding
    # in a near-zero gradient into a 1e-5 weight difference; the gradients themselves are compared exactly in
    # tests/core/test_microbatch.py
    module = make_module(tiny_model_dir, objective=ObjectiveConfig(name=name, behavior_anchor=0.04),
                         micro_batch=MicroBatchConfig(max_tokens=max_tokens),
                         optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.0))
    record = Record()
    fit(module, make_data(data_dir), steps=3, callbacks=[record], **trainer_kwargs)
    return record


@pytest.mark.parametrize("name", ["ggpo", "grpo"])
@pytest.mark.parametrize("max_tokens", [48, 7])  # whole and split groups; smaller than any response
def test_micro_batched_training_matches_the_single_pass(tiny_model_dir, data_dir, name, max_tokens):
    single = run(tiny_model_dir, data_dir, name, None, gradient_clip_val=1.0)
    micro = run(tiny_model_dir, data_dir, name, max_tokens, gradient_clip_val=1.0)
    assert len(single.losses) == len(micro.losses) == 3
    assert micro.losses == pytest.approx(single.losses, rel=1e-5, abs=1e-5)
    for n, value in single.first_update.items():
        torch.testing.assert_close(micro.first_update[n], value, rtol=1e-5, atol=1e-5)


def test_a_negative_budget_is_an_error_naming_the_key(tiny_model_dir):
    with pytest.raises(ValueError, match="model.micro_batch.max_tokens must be >= 1"):
        make_module(tiny_model_dir, micro_batch=MicroBatchConfig(max_tokens=-5))
