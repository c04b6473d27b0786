"""One step's responses in micro-batches under a token budget, with gradients exact for any split.

A step's loss ``L`` (any registered objective plus the behavior anchor) is a function of the step's token log-probs
``l_bt = log pi(y_bt | ...)`` (``[B, L]``). Its gradient with respect to the weights is

    dL/dtheta = sum_{b,t} c_bt * d l_bt / dtheta,        c = dL/dl  (a [B, L] tensor, 0 off the responses)

so the update is computed in two passes: pass 1 takes every micro-batch's log-probs without gradient, evaluates
``L`` on the whole step (its value, metrics and any NaN are known before any backward) and ``c`` with
``torch.autograd.grad`` on the detached log-probs; pass 2 back-propagates the surrogate ``sum c_bt * l_bt`` one
micro-batch at a time, the gradients accumulating. Exact for every objective, plugins included, whatever the split
(a group may span micro-batches: its normalisation lives in ``c``). The price is one forward without gradient per
response; the memory of the backward is one micro-batch's activations.

Micro-batches hold whole responses (a response longer than the budget is one micro-batch of its own), in padded
rows, longest first: rows x longest row <= ``max_tokens`` (the dynamic batching of verl and SkyRL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ggpo_lightning.core.batch import StepBatch
from ggpo_lightning.core.distributed import max_across_ranks
from ggpo_lightning.core.logprobs import token_logprobs

__all__ = ["MicroBatchConfig", "backward_micro_batches", "micro_batch_rows", "micro_batched_forward",
           "micro_batched_token_logprobs", "plan_micro_batches", "plan_step", "surrogate_loss", "two_pass_loss"]


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


def micro_batch_rows(batch: StepBatch, rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``input_ids``, ``attention_mask`` and ``target_mask`` of ``rows``, cut to their longest row (``[b, l]``)."""
    index = torch.tensor(rows, device=batch.input_ids.device)
    width = int(batch.attention_mask[index].sum(-1).max())  # right-padded rows: their lengths
    return batch.input_ids[index, :width], batch.attention_mask[index, :width], batch.target_mask[index, :width]


def micro_batched_token_logprobs(model: nn.Module, batch: StepBatch, plan: list[list[int]],
                                 chunk_size: int) -> Tensor:
    """Pass 1: token log-probs ``[B, L]`` of the batch's responses under ``model``, without gradient, one
    micro-batch of ``plan`` at a time (an empty micro-batch runs the model on row 0 and discards it: every rank of a
    sharded model must run as many forwards as the others)."""
    out = torch.zeros(batch.target_mask.shape, device=batch.input_ids.device)  # [B, L]
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
