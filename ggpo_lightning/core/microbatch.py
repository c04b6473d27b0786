"""One step's responses in micro-batches under a token budget, with gradients exact for any split.

A step's loss ``L`` (any registered objective plus the behavior anchor) is a function of the step's token log-probs
``l_bt = log pi(y_bt | ...)`` (``[B, L]``). Each step takes one of two exact forms (:class:`StepPasses`):

**One pass**, when the objective declares its denominator
(:attr:`~ggpo_lightning.core.objectives.Objective.denominator`) and every group of the step fits whole in a
micro-batch. The loss is then a sum of per-group terms over counts known before any forward (groups, valid tokens),
so the loss of a micro-batch of whole groups, scaled by its counts over the step's, is its exact share of ``L``
(:class:`~ggpo_lightning.core.step_loss.StepLoss`), and the shares' gradients add up to ``dL/dtheta``: each
micro-batch takes one forward with gradient, its share and its backward. The step's loss and metrics are taken after
on the micro-batches' log-probs (detached); a non-finite loss is known only after the backwards, so the skipped
step drops the gradients accumulated (the training step's NaN guard).

**Two passes**, otherwise (a group longer than the budget must be split; an objective that declares nothing, e.g.
a plugin's). The gradient with respect to the weights is

    dL/dtheta = sum_{b,t} c_bt * d l_bt / dtheta,        c = dL/dl  (a [B, L] tensor, 0 off the responses)

so pass 1 takes every micro-batch's log-probs without gradient, evaluates ``L`` on the whole step (its value,
metrics and any NaN are known before any backward) and ``c`` with ``torch.autograd.grad`` on the detached
log-probs; pass 2 back-propagates the surrogate ``sum c_bt * l_bt`` one micro-batch at a time, the gradients
accumulating. Exact for every objective, plugins included, whatever the split (a group may span micro-batches: its
normalisation lives in ``c``). The price is one forward without gradient per response.

Either way the memory of the backward is one micro-batch's activations. Two-pass micro-batches hold whole responses
(a response longer than the budget is one micro-batch of its own), one-pass ones whole groups, in padded rows,
longest first: rows x longest row <= ``max_tokens`` (the dynamic batching of verl and SkyRL). Every rank runs as
many micro-batches, in the same form (a sharded model's forwards and backwards are collectives).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ggpo_lightning.core.batch import StepBatch, batch_token_logprobs
from ggpo_lightning.core.distributed import max_across_ranks
from ggpo_lightning.core.logprobs import logprob_dtype, token_logprobs
from ggpo_lightning.core.objectives import ObjectiveInputs
from ggpo_lightning.core.step_loss import StepLoss

__all__ = ["MicroBatchConfig", "PendingStep", "StepPasses", "backward_micro_batches", "micro_batch_rows",
           "micro_batch_share", "micro_batched_forward", "micro_batched_token_logprobs", "one_pass_loss",
           "plan_micro_batches", "plan_step", "plan_whole_groups", "surrogate_loss", "two_pass_loss"]


@dataclass
class MicroBatchConfig:
    """Micro-batched steps (recipe group ``model.micro_batch``): activation memory bounded by a token budget instead
    of growing with prompts x K x length."""

    max_tokens: int | None = None
    """Padded tokens per micro-batch (rows x longest row); None or 0 = the whole step in one pass. A response
    longer than the budget is a micro-batch of its own."""

    def errors(self) -> list[str]:
        if self.max_tokens is not None and self.max_tokens < 0:
            return [f"model.micro_batch.max_tokens must be >= 1, or 0/null for one pass, got {self.max_tokens}"]
        return []


def plan_micro_batches(row_tokens: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices per micro-batch: rows sorted longest first and packed greedily while ``rows x longest row <=
    max_tokens`` (the micro-batch's padded tokens); a row longer than the budget alone. Every row once."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    plan: list[list[int]] = []
    longest = 0
    for row in sorted(range(len(row_tokens)), key=lambda r: (-row_tokens[r], r)):
        if plan and longest * (len(plan[-1]) + 1) <= max_tokens:  # rows come longest first: the width stays
            plan[-1].append(row)
            continue
        plan.append([row])
        longest = row_tokens[row]
    return plan


def plan_step(batch: StepBatch, max_tokens: int) -> list[list[int]]:
    """:func:`plan_micro_batches` of the batch's rows, padded with empty micro-batches to the largest count of any
    rank (a sharded model's forwards and backwards are collectives: every rank must run as many)."""
    plan = plan_micro_batches(batch.attention_mask.sum(-1).tolist(), max_tokens)
    return plan + [[] for _ in range(max_across_ranks(len(plan), batch.input_ids.device) - len(plan))]


def plan_whole_groups(batch: StepBatch, max_tokens: int) -> list[list[int]] | None:
    """Group indices per micro-batch of one pass: groups sorted by their longest row, longest first, and packed
    greedily while ``rows x longest row <= max_tokens``; every group once. None when a group alone is over the
    budget (it must be split: two passes)."""
    lengths = batch.attention_mask.sum(-1).tolist()
    rows = batch.group_rows()
    longest = [max(lengths[r] for r in group) for group in rows]
    if any(len(group) * width > max_tokens for group, width in zip(rows, longest)):
        return None
    plan: list[list[int]] = []
    width = count = 0
    for g in sorted(range(len(rows)), key=lambda g: (-longest[g], g)):
        if plan and width * (count + len(rows[g])) <= max_tokens:  # groups come longest first: the width stays
            plan[-1].append(g)
            count += len(rows[g])
            continue
        plan.append([g])
        width, count = longest[g], len(rows[g])
    return plan


def micro_batch_rows(batch: StepBatch, rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``input_ids``, ``attention_mask`` and ``target_mask`` of ``rows``, cut to their longest row (``[b, l]``)."""
    index = torch.tensor(rows, device=batch.input_ids.device)
    width = int(batch.attention_mask[index].sum(-1).max())  # right-padded rows: their lengths
    return batch.input_ids[index, :width], batch.attention_mask[index, :width], batch.target_mask[index, :width]


def _logprob_buffer(model: nn.Module, batch: StepBatch) -> Tensor:
    """Zeros ``[B, L]`` for the batch's token log-probs under ``model``, in the dtype the log-prob forwards return
    (a float32 buffer would round a float64 model's log-probs, and the micro-batched paths would no longer equal the
    whole pass to float64 rounding)."""
    dtype = logprob_dtype(next(model.parameters()).dtype)
    return torch.zeros(batch.target_mask.shape, dtype=dtype, device=batch.input_ids.device)  # [B, L]


def micro_batched_token_logprobs(model: nn.Module, batch: StepBatch, plan: list[list[int]],
                                 chunk_size: int) -> Tensor:
    """Pass 1: token log-probs ``[B, L]`` of the batch's responses under ``model``, without gradient, one
    micro-batch of ``plan`` at a time (an empty micro-batch runs the model on row 0 and discards it: every rank of a
    sharded model must run as many forwards as the others)."""
    out = _logprob_buffer(model, batch)  # [B, L]
    with torch.no_grad():
        for rows in plan:
            ids, attention, target = micro_batch_rows(batch, rows or [0])
            values = token_logprobs(model, ids, attention, target, chunk_size)  # [b, l]
            if rows:
                out[rows, :values.shape[1]] = values
    return out


def micro_batched_forward(max_tokens: int, chunk_size: int,
                          collective: bool) -> Callable[[nn.Module, StepBatch], Tensor]:
    """``forward(model, batch)``: :func:`micro_batched_token_logprobs` in micro-batches of ``max_tokens`` (the
    reference's forward in a micro-batched step). ``collective`` (a sharded model, whose forwards are collectives):
    padded to every rank's count; else planned alone (a rank with nothing to compute runs no forward)."""

    def forward(model: nn.Module, batch: StepBatch) -> Tensor:
        plan = (plan_step(batch, max_tokens) if collective
                else plan_micro_batches(batch.attention_mask.sum(-1).tolist(), max_tokens))
        return micro_batched_token_logprobs(model, batch, plan, chunk_size)

    return forward


def two_pass_loss(learner: nn.Module, batch: StepBatch, plan: list[list[int]], chunk_size: int,
                  loss_of: Callable[[StepBatch, Tensor], tuple[Tensor, Any]]
                  ) -> tuple[Tensor, Any, Tensor | None, Tensor]:
    """Pass 1: ``loss_of(batch, l)`` (the step's loss and what it was computed from) at the learner's token
    log-probs ``l`` taken per micro-batch without gradient, and ``c = dL/dl`` (``[B, L]``) by ``torch.autograd.grad``
    on the detached log-probs; ``c`` is None when the loss is not finite (the step is skipped: no backward at all).
    Returns the loss, what it was computed from, ``c`` and ``l`` (detached, for the step's metrics)."""
    leaf = micro_batched_token_logprobs(learner, batch, plan, chunk_size).requires_grad_()  # [B, L]
    loss, inputs = loss_of(batch, leaf)
    if not torch.isfinite(loss):
        return loss.detach(), inputs, None, leaf.detach()
    (coefficients,) = torch.autograd.grad(loss, leaf)  # [B, L]
    return loss.detach(), inputs, coefficients, leaf.detach()


def backward_micro_batches(learner: nn.Module, batch: StepBatch, plan: list[list[int]], coefficients: Tensor,
                           chunk_size: int, backward: Callable[[Tensor], Any]) -> Tensor:
    """Pass 2: ``backward`` of every micro-batch's :func:`surrogate_loss` but the last, which is returned (the
    trainer back-propagates it, and a data-parallel strategy reduces the accumulated gradients there)."""
    *first, last = plan
    for rows in first:
        backward(surrogate_loss(learner, batch, rows, coefficients, chunk_size))
    return surrogate_loss(learner, batch, last, coefficients, chunk_size)


def surrogate_loss(model: nn.Module, batch: StepBatch, rows: list[int], coefficients: Tensor,
                   chunk_size: int) -> Tensor:
    """Pass 2 for one micro-batch: ``sum_{b in rows, t} c_bt * log pi(y_bt)``, whose gradient is the micro-batch's
    share of the step's (an empty micro-batch contributes zero through row 0: the forward and backward still run)."""
    ids, attention, target = micro_batch_rows(batch, rows or [0])
    values = token_logprobs(model, ids, attention, target, chunk_size)  # [b, l]
    weights = coefficients[rows or [0], :values.shape[1]]  # [b, l]
    surrogate = (weights * values).sum()
    return surrogate if rows else surrogate * 0.0


def one_pass_loss(learner: nn.Module, batch: StepBatch, plan: list[list[int]], chunk_size: int, loss: StepLoss,
                  backward: Callable[[Tensor], Any]) -> tuple[Tensor, Tensor, Tensor]:
    """One pass: for every micro-batch of whole groups of ``plan`` (:func:`plan_whole_groups`, padded with empty
    ones) its forward with gradient and :func:`micro_batch_share`, ``backward`` of every share but the last, which
    is returned (the trainer back-propagates it). Also returns the learner's and the reference's token log-probs
    ``[B, L]`` (detached, for the step's loss and metrics). The objective must declare its denominator."""
    reference = loss.reference(batch)  # [B, L]: the step's reference pass, as in the other forms
    totals = loss.denominators(batch)  # before any forward
    token_logp = _logprob_buffer(learner, batch)  # [B, L]
    *first, last = plan
    for groups in first:
        backward(micro_batch_share(learner, batch, groups, chunk_size, loss, reference, totals, token_logp))
    return micro_batch_share(learner, batch, last, chunk_size, loss, reference, totals, token_logp), token_logp, \
        reference


def micro_batch_share(learner: nn.Module, batch: StepBatch, groups: list[int], chunk_size: int, loss: StepLoss,
                      reference: Tensor, totals: tuple[Tensor, Tensor], out: Tensor) -> Tensor:
    """One pass for one micro-batch: the share of the step's loss of the whole groups ``groups`` (with gradient),
    at the learner's token log-probs taken here, which are written (detached) into their rows of ``out`` ``[B, L]``.
    ``reference``: the step's reference token log-probs ``[B, L]``; ``totals``: the step's
    :meth:`~ggpo_lightning.core.step_loss.StepLoss.denominators`. An empty micro-batch contributes zero through
    group 0 (the forward and backward still run)."""
    part, rows = batch.select(groups or [0])
    values = token_logprobs(learner, part.input_ids, part.attention_mask, part.target_mask, chunk_size)  # [b, l]
    share = loss.share(part, values, reference[rows, :values.shape[1]], totals)
    if not groups:
        return share * 0.0
    out[rows, :values.shape[1]] = values.detach()
    return share


@dataclass
class PendingStep:
    """A step whose loss is known and whose backward is not (all) done."""

    loss: Tensor
    """The step's loss (detached)."""
    inputs: ObjectiveInputs
    """What it was computed from (for the step's metrics)."""
    token_logp: Tensor
    """The learner's token log-probs ``[B, L]`` (detached)."""
    passes: str
    """``"whole"`` (no micro-batches), ``"one"`` or ``"two"``."""
    finish: Callable[[], Tensor]
    """Back-propagates what remains but the last micro-batch, whose loss it returns (the trainer back-propagates
    it, and a data-parallel strategy reduces the accumulated gradients there). Not called for a skipped step."""


@dataclass
class StepPasses:
    """How a step's loss and gradient are computed (recipe group ``model.micro_batch``): the whole step at once
    without a budget; else micro-batched in one pass where the objective declares its denominator and every group
    fits whole in a micro-batch on every rank, in two passes otherwise (the module docstring)."""

    max_tokens: int | None
    chunk_size: int

    def run(self, learner: nn.Module, batch: StepBatch, loss: StepLoss,
            backward: Callable[[Tensor], Any]) -> PendingStep:
        """The step's forwards (and, in one pass, every micro-batch's backward but the last's) with ``learner`` on
        ``batch``; ``backward`` back-propagates a micro-batch's loss. A one-pass step skipped for a non-finite loss
        has accumulated gradients: the caller drops them."""
        if not self.max_tokens:  # the step's activations all at once
            token_logp = batch_token_logprobs(learner, batch, self.chunk_size)  # [B, L]
            value, inputs = loss(batch, token_logp)
            return PendingStep(value.detach(), inputs, token_logp.detach(), "whole", lambda: value)
        groups = plan_whole_groups(batch, self.max_tokens) if loss.declared else None
        device = batch.input_ids.device
        if not max_across_ranks(int(groups is None), device):  # every rank's groups fit whole: one pass
            groups += [[] for _ in range(max_across_ranks(len(groups), device) - len(groups))]
            last, token_logp, reference = one_pass_loss(learner, batch, groups, self.chunk_size, loss, backward)
            value, inputs = loss(batch, token_logp, reference)  # the step's, on the log-probs taken (no forward)
            return PendingStep(value.detach(), inputs, token_logp, "one", lambda: last)
        plan = plan_step(batch, self.max_tokens)  # the loss and its coefficients first, then the backwards
        value, inputs, coefficients, token_logp = two_pass_loss(learner, batch, plan, self.chunk_size, loss)
        return PendingStep(value, inputs, token_logp, "two", lambda: backward_micro_batches(
            learner, batch, plan, coefficients, self.chunk_size, backward))
