"""Micro-batched steps: the plan keeps the budget, and the micro-batched gradient equals the single pass for every
objective, whatever the split: in one pass where the objective declares its denominator and the groups fit whole,
in two passes where a group must be split (a budget smaller than one response) or the objective declares nothing.

The paths are compared in float64 (the ``float64`` fixture): they sum in other orders (per micro-batch, per part, rows
longest first), which in float32 costs a few ulps that depend on the CPU's kernels; in float64 losses, gradients of
every parameter and log-probs agree within ``FLOAT64_TOLERANCE`` (its derivation in ``float64_models``)."""

from __future__ import annotations

import pytest
import torch

from dataclasses import replace

from ggpo_lightning.core.microbatch import (StepPasses, backward_micro_batches, micro_batched_token_logprobs,
                                            plan_micro_batches, plan_step, plan_whole_groups, two_pass_loss)
from ggpo_lightning.core.objectives import IS_MODES, ObjectiveConfig, available_objectives
from ggpo_lightning.core.batch import batch_token_logprobs
from ggpo_lightning.testing import make_group

from float64_models import FLOAT64_TOLERANCE
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
def test_two_pass_gradients_equal_the_single_pass(tiny_model_dir, tiny_lm, float64, settings, budget):
    _, tokenizer = tiny_lm
    objective = ObjectiveConfig(**settings, beta=0.1, behavior_anchor=0.3)  # the anchor and the KL term on
    single = float64(make_module(tiny_model_dir, objective=objective))
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
    assert two_pass.dtype == torch.float64
    torch.testing.assert_close(two_pass, loss.detach(), **FLOAT64_TOLERANCE)
    for got, want in zip(gradients(single), expected):
        torch.testing.assert_close(got, want, **FLOAT64_TOLERANCE)


def test_micro_batched_log_probs_equal_the_whole_batch(tiny_model_dir, tiny_lm, float64):
    model, tokenizer = tiny_lm
    model = float64(model)
    module = make_module(tiny_model_dir, shared_prefix=False)
    batch = module.pack(groups_of(tokenizer))
    with torch.no_grad():
        whole = batch_token_logprobs(model, batch, 64)
    for budget in (1, 12, 10_000):
        got = micro_batched_token_logprobs(model, batch, plan_micro_batches(batch.attention_mask.sum(-1).tolist(),
                                                                            budget), 64)
        assert got.dtype == whole.dtype == torch.float64  # the micro-batches' buffer keeps the model's precision
        torch.testing.assert_close(got, whole, **FLOAT64_TOLERANCE)


def test_a_non_finite_loss_gives_no_coefficients(tiny_model_dir, tiny_lm):
    _, tokenizer = tiny_lm
    module = make_module(tiny_model_dir)
    batch = module.pack(groups_of(tokenizer))
    loss, _, coefficients, _ = two_pass_loss(module.learner, batch, plan_step(batch, 20), 64,
                                          lambda b, l: (module.step_loss(b, l)[0] * float("nan"), None))
    assert torch.isnan(loss) and coefficients is None
    assert all(p.grad is None for p in module.learner.parameters())  # nothing back-propagated


def test_two_pass_gradients_equal_the_single_pass_with_lora(tiny_model_dir, tiny_lm, float64):
    pytest.importorskip("peft")
    from ggpo_lightning.models.lora import LoraSettings

    _, tokenizer = tiny_lm
    module = float64(make_module(tiny_model_dir, objective=ObjectiveConfig(behavior_anchor=0.3),
                                 lora=LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"])))
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
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)


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


def test_coverage_metrics_equal_single_pass_and_micro_batched(tiny_model_dir, tiny_lm, float64):
    from ggpo_lightning.core.metrics import coverage_metrics

    _, tokenizer = tiny_lm
    module = float64(make_module(tiny_model_dir, shared_prefix=False))
    batch = module.pack(groups_of(tokenizer))
    with torch.no_grad():
        single = coverage_metrics(batch_token_logprobs(module.learner, batch, 64), batch)
    *_, micro = two_pass_loss(module.learner, batch, plan_step(batch, 20), 64, module.step_loss)
    split = coverage_metrics(micro, batch)
    assert set(single) == set(split) and "coverage_ess" in single
    for name in single:
        torch.testing.assert_close(split[name], single[name], **FLOAT64_TOLERANCE)


def group_costs(batch) -> list[int]:
    """Each group's padded tokens (rows x its longest row): what a micro-batch of it alone takes."""
    lengths = batch.attention_mask.sum(-1).tolist()
    return [len(rows) * max(lengths[r] for r in rows) for rows in batch.group_rows()]


def test_whole_groups_are_packed_under_the_budget_or_none_fits(tiny_model_dir, tiny_lm):
    _, tokenizer = tiny_lm
    batch = make_module(tiny_model_dir).pack(groups_of(tokenizer))
    costs, lengths = group_costs(batch), batch.attention_mask.sum(-1).tolist()
    plan = plan_whole_groups(batch, max(costs))
    assert sorted(g for groups in plan for g in groups) == [0, 1, 2]
    for groups in plan:
        rows = [r for g in groups for r in batch.group_rows()[g]]
        assert len(rows) * max(lengths[r] for r in rows) <= max(costs)
    assert plan_whole_groups(batch, 10_000) == [[0, 1, 2]]
    assert plan_whole_groups(batch, max(costs) - 1) is None  # the largest group must be split


def test_a_selected_part_holds_its_groups_whole(tiny_model_dir, tiny_lm):
    _, tokenizer = tiny_lm
    batch = make_module(tiny_model_dir, objective=ObjectiveConfig(name="grpo")).pack(groups_of(tokenizer))
    part, rows = batch.select([2, 0])
    assert rows == batch.group_rows()[2] + batch.group_rows()[0] == [7, 0, 1, 2, 3]
    assert [g.prompt_id for g in part.groups] == ["c", "a"]
    width = part.input_ids.shape[1]
    assert torch.equal(part.input_ids, batch.input_ids[rows, :width])
    assert torch.equal(part.behavior_token_logp, batch.behavior_token_logp[rows, :width])
    assert torch.equal(part.group_mask, batch.group_mask[[2, 0]]) and torch.equal(part.rewards, batch.rewards[[2, 0]])
    assert torch.equal(part.response_lengths(), batch.response_lengths()[[2, 0]])
    assert int(batch.attention_mask[rows].sum(-1).max()) == width


# GGPO, AGRO, MaxRL and GRPO; GRPO with each importance-sampling correction and with the off-policy mask
DECLARED = ([{"name": name} for name in ("ggpo", "agro", "maxrl", "grpo", "prime_rl", "oapl", "vespo")]
            + [{"name": "grpo", "importance_sampling": mode} for mode in IS_MODES]
            + [{"name": "grpo", "off_policy_mask_threshold": 0.5},
               {"name": "grpo", "importance_sampling": "token_mask", "importance_sampling_clip_min": 0.5,
                "off_policy_mask_threshold": 0.0}])


def single_pass_gradients(module, batch):
    loss, _ = module.step_loss(batch)
    loss.backward()
    return loss.detach(), gradients(module)


def micro_batched(module, batch, budget):
    """The step through :class:`StepPasses` at ``budget``, its backwards all run: (pending step, gradients)."""
    pending = StepPasses(budget, 64).run(module.learner, batch, module.loss_terms(), lambda s: s.backward())
    pending.finish().backward()
    return pending, gradients(module)


def moved_module(tiny_model_dir, settings, to_float64):
    module = to_float64(make_module(tiny_model_dir, objective=ObjectiveConfig(**settings, beta=0.1,
                                                                              behavior_anchor=0.3)))
    torch.manual_seed(1)
    with torch.no_grad():  # away from the reference and the behavior: the KL terms, ratios and masks are not trivial
        for p in module.learner.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("split", ["whole", "mixed", "split"])
@pytest.mark.parametrize("settings", DECLARED, ids=lambda s: "+".join(map(str, s.values())))
def test_micro_batched_gradients_equal_the_single_pass(tiny_model_dir, tiny_lm, float64, settings, split):
    """``whole``: the largest group's cost as the budget, every group fits, several micro-batches: one pass.
    ``mixed``: a budget some groups fit and some do not; ``split``: 1 token, every response alone: two passes."""
    _, tokenizer = tiny_lm
    module = moved_module(tiny_model_dir, settings, float64)
    batch = module.pack(groups_of(tokenizer))
    costs = sorted(group_costs(batch))
    budget = {"whole": costs[-1], "mixed": costs[0], "split": 1}[split]
    loss, expected = single_pass_gradients(module, batch)
    pending, got = micro_batched(module, batch, budget)
    assert pending.passes == ("one" if split == "whole" else "two")
    assert split != "whole" or len(plan_whole_groups(batch, budget)) > 1
    torch.testing.assert_close(pending.loss, loss, **FLOAT64_TOLERANCE)
    assert any(g.abs().sum() > 0 for g in expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)


def count_forwards(model) -> list[int]:
    """One entry per forward of ``model`` (its input embeddings run once per forward)."""
    calls = []
    model.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_an_objective_without_a_declared_denominator_takes_two_passes(tiny_model_dir, tiny_lm, float64,
                                                                       monkeypatch):
    """A plugin's objective declares nothing: two passes, two forwards per micro-batch, even where groups fit whole;
    the declared one takes one forward per micro-batch. Both equal the single pass."""
    _, tokenizer = tiny_lm
    module = moved_module(tiny_model_dir, {"name": "ggpo"}, float64)
    batch = module.pack(groups_of(tokenizer))
    budget = max(group_costs(batch))
    micro_batches = len(plan_whole_groups(batch, budget))
    _, expected = single_pass_gradients(module, batch)
    calls = count_forwards(module.learner)
    pending, declared = micro_batched(module, batch, budget)
    assert pending.passes == "one" and len(calls) == micro_batches
    calls.clear()
    monkeypatch.setattr(module, "objective", replace(module.objective, name="plugin", denominator=None))
    pending, undeclared = micro_batched(module, batch, budget)
    assert pending.passes == "two" and len(calls) == 2 * len(plan_step(batch, budget))
    for one, two, e in zip(declared, undeclared, expected):
        torch.testing.assert_close(one, e, **FLOAT64_TOLERANCE)
        torch.testing.assert_close(two, e, **FLOAT64_TOLERANCE)


def test_one_pass_metrics_inputs_equal_the_single_pass(tiny_model_dir, tiny_lm, float64):
    """What the step's metrics are computed from (the learner's token log-probs and the objective's inputs) is the
    whole step's, as in the single pass."""
    _, tokenizer = tiny_lm
    module = moved_module(tiny_model_dir, {"name": "grpo"}, float64)
    batch = module.pack(groups_of(tokenizer))
    with torch.no_grad():
        whole = batch_token_logprobs(module.learner, batch, 64)
        _, inputs = module.step_loss(batch, whole)
    pending = StepPasses(max(group_costs(batch)), 64).run(module.learner, batch, module.loss_terms(),
                                                          lambda s: s.backward())
    assert pending.passes == "one"
    torch.testing.assert_close(pending.token_logp, whole, **FLOAT64_TOLERANCE)
    for name in ("logp", "ref_logp", "token_logp", "behavior_logp"):
        torch.testing.assert_close(getattr(pending.inputs, name), getattr(inputs, name), **FLOAT64_TOLERANCE)


def test_a_rank_with_fewer_one_pass_micro_batches_pads_with_empty_ones(tiny_model_dir, tiny_lm, monkeypatch):
    """Another rank needs 2 more micro-batches: this one runs 2 empty ones (group 0, zero weight), and its gradient
    is unchanged."""
    import ggpo_lightning.core.microbatch as microbatch

    _, tokenizer = tiny_lm
    module = make_module(tiny_model_dir, objective=ObjectiveConfig(behavior_anchor=0.3))
    batch = module.pack(groups_of(tokenizer))
    budget = max(group_costs(batch))
    own = len(plan_whole_groups(batch, budget))
    pending, alone = micro_batched(module, batch, budget)
    calls = count_forwards(module.learner)
    monkeypatch.setattr(microbatch, "max_across_ranks", lambda value, device: value + 2 if value > 1 else value)
    pending, padded = micro_batched(module, batch, budget)
    assert pending.passes == "one" and len(calls) == own + 2
    for got, want in zip(padded, alone):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
