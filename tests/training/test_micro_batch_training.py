"""A micro-batched run trains as the single-pass run: the same losses and the same weights at the same seed, in one
pass (whole groups) and in two (a budget smaller than one group); gradient clipping sees the accumulated gradients;
a non-finite loss found after a one-pass step's backwards skips the step, its gradients dropped. With asynchronous rollouts
(whose sampled responses depend on timing) each update's accumulated gradient equals the single-pass gradient of
the same step's batch."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from dataclasses import replace

from ggpo_lightning.core.microbatch import MicroBatchConfig
from ggpo_lightning.core.objectives import ObjectiveConfig
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig

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
    record.passes = passes_taken(module)
    fit(module, make_data(data_dir), steps=3, callbacks=[record], **trainer_kwargs)
    return record


def passes_taken(module) -> list[str]:
    """The form of each of ``module``'s steps, as they run: ``whole``, ``one`` or ``two`` (passes)."""
    taken, run_step = [], module.passes.run
    module.passes.run = lambda *args: taken.append((pending := run_step(*args)).passes) or pending
    return taken


@pytest.mark.parametrize("name", ["ggpo", "grpo"])
@pytest.mark.parametrize("max_tokens", [48, 7])  # whole groups (one pass); smaller than any response (two passes)
def test_micro_batched_training_matches_the_single_pass(tiny_model_dir, data_dir, name, max_tokens):
    single = run(tiny_model_dir, data_dir, name, None, gradient_clip_val=1.0)
    micro = run(tiny_model_dir, data_dir, name, max_tokens, gradient_clip_val=1.0)
    assert single.passes == ["whole"] * 3 and micro.passes == ["one" if max_tokens == 48 else "two"] * 3
    assert len(single.losses) == len(micro.losses) == 3
    assert micro.losses == pytest.approx(single.losses, rel=1e-5, abs=1e-5)
    for n, value in single.first_update.items():
        torch.testing.assert_close(micro.first_update[n], value, rtol=1e-5, atol=1e-5)


class SinglePassGradient(L.Callback):
    """At every update: the accumulated (micro-batched) gradient, and the single-pass gradient of the same step's
    batch (the module's ``pack`` records it) taken beside it with ``torch.autograd.grad``, before clipping."""

    def __init__(self, module) -> None:
        self.batches, self.pairs = [], []
        pack = module.pack
        module.pack = lambda groups: self.batches.append(pack(groups)) or self.batches[-1]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        params = [p for p in pl_module.learner.parameters() if p.requires_grad]
        loss, _ = pl_module.step_loss(self.batches[-1])  # one pass: every response's activations at once
        single = torch.autograd.grad(loss, params)
        self.pairs.append(([p.grad.detach().clone() for p in params], single))


def test_async_micro_batched_updates_take_the_single_pass_gradient_of_their_batch(tiny_model_dir, data_dir,
                                                                                   monkeypatch):
    from ggpo_lightning.core import microbatch

    plans = []
    two_pass_loss = microbatch.two_pass_loss

    def counted(learner, batch, plan, *args):
        plans.append(len(plan))
        return two_pass_loss(learner, batch, plan, *args)

    monkeypatch.setattr(microbatch, "two_pass_loss", counted)
    torch.manual_seed(0)
    rollout = RolloutConfig(k=4, schedule="async", async_worker="thread", max_staleness=1,
                            sampling=SamplingConfig(max_new_tokens=3))
    module = make_module(tiny_model_dir, rollout=rollout, objective=ObjectiveConfig(behavior_anchor=0.04),
                         micro_batch=MicroBatchConfig(max_tokens=7),  # below any row: every response alone
                         optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.0))
    record = SinglePassGradient(module)
    fit(module, make_data(data_dir), steps=3, callbacks=[record], gradient_clip_val=1.0)
    assert plans == [12, 12, 12] == [b.input_ids.shape[0] for b in record.batches]  # 3 groups x K=4, split
    assert len(record.pairs) == 3
    for accumulated, single in record.pairs:
        assert any(g.abs().sum() > 0 for g in single)
        for a, b in zip(accumulated, single):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_non_finite_loss_after_one_pass_backwards_skips_the_step_and_drops_its_gradients(tiny_model_dir, data_dir,
                                                                                            monkeypatch):
    """In one pass the loss is known only after the micro-batches' backwards: a non-finite one still skips the step
    (no parameter moves, the gradients accumulated are dropped, the NaN guard counts it)."""
    module = make_module(tiny_model_dir, max_nan_steps=2, micro_batch=MicroBatchConfig(max_tokens=48))
    before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    real_loss = module.objective.loss
    monkeypatch.setattr(module, "objective", replace(module.objective, loss=lambda x, c: real_loss(x, c) * float("nan")))
    passes, accumulated, skip = passes_taken(module), [], module._skip_nan_step

    def skip_step():
        accumulated.append(any(p.grad is not None for p in module.learner.parameters()))
        return skip()

    monkeypatch.setattr(module, "_skip_nan_step", skip_step)
    left = []
    after = type("After", (L.Callback,), {"on_train_batch_end": lambda self, trainer, pl_module, *a: left.append(
        [p.grad for p in pl_module.learner.parameters() if p.grad is not None])})()
    trainer = fit(module, make_data(data_dir), steps=5, callbacks=[after])
    assert passes == ["one", "one"] and accumulated == [True, True]  # the backwards had run
    assert module.nan_guard.total == 2 and trainer.global_step == 2 and trainer.should_stop
    assert left == [[], []]  # dropped
    assert all(torch.equal(p, before[n]) for n, p in module.learner.named_parameters())


def test_a_negative_budget_is_an_error_naming_the_key(tiny_model_dir):
    with pytest.raises(ValueError, match="model.micro_batch.max_tokens must be >= 1"):
        make_module(tiny_model_dir, micro_batch=MicroBatchConfig(max_tokens=-5))
