"""Micro-batched steps: the plan keeps the budget, and the two-pass gradient equals the single pass for every
objective, whatever the split (groups across micro-batches, a budget smaller than one response)."""

from __future__ import annotations

import pytest
import torch

from ggpo_lightning.core.microbatch import (backward_micro_batches, micro_batched_token_logprobs,
                                            plan_micro_batches, plan_step, two_pass_loss)
from ggpo_lightning.core.objectives import ObjectiveConfig, available_objectives
from ggpo_lightning.core.batch import batch_token_logprobs
from ggpo_lightning.testing import make_group

from training_runs import make_module


def test_the_plan_keeps_the_budget_and_takes_every_row_once():
    lengths = [5, 9, 3, 9, 4, 12, 2]
    plan = plan_micro_batches(lengths, max_tokens=18)
    assert sorted(r for rows in plan for r in rows) == list(range(len(lengths)))
    assert all(len(rows) * max(lengths[r] for r in rows) <= 18 for rows in plan)
    assert [lengths[rows[0]] for rows in plan] == sorted((lengths[rows[0]] for rows in plan), reverse=True)
    assert plan_micro_batches(lengths, max_tokens=3)[0] == [5]  # longer than the budget: alone
    assert plan_micro_batches(lengths, max_tokens=1000) == [[5, 1, 3, 0, 4, 2, 6]]  # everything, longest first
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        plan_micro_batches(lengths, max_tokens=0)


def groups_of(tokenizer):
    """Three groups: K=4 with varied lengths, K=3 (a response absent), and one with a single valid response."""
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]  # noqa: E731
    prompt = lambda s: tokenizer(s)["input_ids"]  # noqa: E731

    def group(p, answers, rewards, pid):
        ids = [enc(a) for a in answers]
        return make_group(prompt(p), ids, rewards, prompt_id=pid, version=1,
                          behavior_logprobs=[[-0.7 - 0.1 * t for t in range(len(i))] for i in ids])

    return [group("1+2=", ["3", "14", "3", "4+4"], [1.0, 0.0, 1.0, 0.0], "a"),
            group("3+5=", ["8", "9", "88"], [1.0, 0.0, 0.0], "b"),
            group("2+2=", ["4"], [1.0], "c")]


def gradients(module) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in module.learner.parameters()]
    module.learner.zero_grad(set_to_none=True)
    return grads


# every registered objective, and GRPO with corrections (weights from pi_old / mu, a sequence mask on the negatives)
OBJECTIVES = [{"name": name} for name in sorted(available_objectives())] + [
    {"name": "grpo", "importance_sampling": "token_truncate", "off_policy_mask_threshold": 0.5}]


@pytest.mark.parametrize("budget", [10_000, 20, 1])  # one micro-batch; groups split; every response alone
@pytest.mark.parametrize("settings", OBJECTIVES, ids=lambda s: "+".join(map(str, s.values())))
def test_two_pass_gradients_equal_the_single_pass(tiny_model_dir, tiny_lm, settings, budget):
    _, tokenizer = tiny_lm
    objective = ObjectiveConfig(**settings, beta=0.1, behavior_anchor=0.3)  # the anchor and the KL term on
    single = make_module(tiny_model_dir, objective=objective)
    batch = single.pack(groups_of(tokenizer))
    torch.manual_seed(1)
    with torch.no_grad():  # away from the reference: the KL terms are not zero
        for p in single.learner.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, _ = single.step_loss(batch)
    loss.backward()
    expected = gradients(single)

    plan = plan_step(batch, budget)
    assert (len(plan) == 1) == (budget == 10_000) and sum(map(len, plan)) == batch.input_ids.shape[0]
    two_pass, _, coefficients, _ = two_pass_loss(single.learner, batch, plan, 64, single.step_loss)
    last = backward_micro_batches(single.learner, batch, plan, coefficients, 64, lambda s: s.backward())
    last.backward()
    torch.testing.assert_close(two_pass, loss.detach(), rtol=1e-6, atol=1e-7)
    for got, want in zip(gradients(single), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_micro_batched_log_probs_equal_the_whole_batch(tiny_model_dir, tiny_lm):
    model, tokenizer = tiny_lm
    module = make_module(tiny_model_dir, shared_prefix=False)
    batch = module.pack(groups_of(tokenizer))
    with torch.no_grad():
        whole = batch_token_logprobs(model, batch, 64)
    for budget in (1, 12, 10_000):
        got = micro_batched_token_logprobs(model, batch, plan_micro_batches(batch.attention_mask.sum(-1).tolist(),
                                                                            budget), 64)
        torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6)


def test_a_non_finite_loss_gives_no_coefficients(tiny_model_dir, tiny_lm):
    _, tokenizer = tiny_lm
    module = make_module(tiny_model_dir)
    batch = module.pack(groups_of(tokenizer))
    loss, _, coefficients, _ = two_pass_loss(module.learner, batch, plan_step(batch, 20), 64,
                                          lambda b, l: (module.step_loss(b, l)[0] * float("nan"), None))
    assert torch.isnan(loss) and coefficients is None
    assert all(p.grad is None for p in module.learner.parameters())  # nothing back-propagated


def test_two_pass_gradients_equal_the_single_pass_with_lora(tiny_model_dir, tiny_lm):
    pytest.importorskip("peft")
    from ggpo_lightning.models.lora import LoraSettings

    _, tokenizer = tiny_lm
    module = make_module(tiny_model_dir, lora=LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]),
                         objective=ObjectiveConfig(behavior_anchor=0.3))
    torch.manual_seed(2)
    with torch.no_grad():  # the adapter off zero, as training would move it
        for name, p in module.learner.named_parameters():
            if ".lora_" in name:
                p.add_(0.3 * torch.randn_like(p))
    batch = module.pack(groups_of(tokenizer))
    loss, _ = module.step_loss(batch)
    loss.backward()
    expected = [p.grad.clone() for p in module.learner.parameters() if p.requires_grad]
    module.learner.zero_grad(set_to_none=True)
    plan = plan_step(batch, 20)
    _, _, coefficients, _ = two_pass_loss(module.learner, batch, plan, 64, module.step_loss)
    backward_micro_batches(module.learner, batch, plan, coefficients, 64, lambda s: s.backward()).backward()
    got = [p.grad for p in module.learner.parameters() if p.requires_grad]
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_a_rank_with_fewer_micro_batches_pads_with_empty_ones_that_change_nothing(tiny_model_dir, tiny_lm,
                                                                                    monkeypatch):
    """Another rank needs 2 more micro-batches: this one runs 2 empty ones (forward and backward on row 0, zero
    weight), so a sharded model's collectives line up, and its gradient is unchanged."""
    import ggpo_lightning.core.microbatch as microbatch

    _, tokenizer = tiny_lm
    module = make_module(tiny_model_dir)
    batch = module.pack(groups_of(tokenizer))
    own = plan_micro_batches(batch.attention_mask.sum(-1).tolist(), 20)
    monkeypatch.setattr(microbatch, "max_across_ranks", lambda value, device: value + 2)
    plan = plan_step(batch, 20)
    assert plan == own + [[], []]
    _, _, coefficients, _ = two_pass_loss(module.learner, batch, plan, 64, module.step_loss)
    backward_micro_batches(module.learner, batch, plan, coefficients, 64, lambda s: s.backward()).backward()
    padded = gradients(module)
    _, _, coefficients, _ = two_pass_loss(module.learner, batch, own, 64, module.step_loss)
    backward_micro_batches(module.learner, batch, own, coefficients, 64, lambda s: s.backward()).backward()
    for got, want in zip(padded, gradients(module)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_coverage_metrics_equal_single_pass_and_micro_batched(tiny_model_dir, tiny_lm):
    from ggpo_lightning.core.metrics import coverage_metrics

    _, tokenizer = tiny_lm
    module = make_module(tiny_model_dir, shared_prefix=False)
    batch = module.pack(groups_of(tokenizer))
    with torch.no_grad():
        single = coverage_metrics(batch_token_logprobs(module.learner, batch, 64), batch)
    *_, micro = two_pass_loss(module.learner, batch, plan_step(batch, 20), 64, module.step_loss)
    split = coverage_metrics(micro, batch)
    assert set(single) == set(split) and "coverage_ess" in single
    for name in single:
        torch.testing.assert_close(split[name], single[name], rtol=1e-5, atol=1e-6)
