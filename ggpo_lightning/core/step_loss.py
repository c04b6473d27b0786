"""A step's loss: the configured objective plus ``lambda`` times the behavior anchor, on the whole step or as the
exact share of some of its groups.

When the objective declares its denominator (:attr:`~ggpo_lightning.core.objectives.Objective.denominator`) the
step's loss is a sum of per-group terms over counts known before any forward (``D`` the objective's, ``D_a`` the
anchor's, :func:`~ggpo_lightning.core.drift.anchored_groups`)::

    L = sum_g t_g / max(D, 1) + lambda * sum_g a_g / max(D_a, 1)

so the loss of a subset ``P`` of whole groups, scaled by its counts over the step's, is its share of ``L``::

    share(P) = loss(P) * D(P) / max(D, 1) + lambda * anchor(P) * D_a(P) / max(D_a, 1)
             = sum_{g in P} t_g / max(D, 1) + lambda * sum_{g in P} a_g / max(D_a, 1)

(``loss(P) = sum_{g in P} t_g / max(D(P), 1)``, and ``D(P) = 0`` only where every ``t_g`` is 0). The shares of
disjoint subsets covering the step add up to ``L``, their gradients to ``dL/dtheta``: exact up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ggpo_lightning.core.batch import StepBatch, objective_inputs
from ggpo_lightning.core.drift import anchored_groups, behavior_anchor
from ggpo_lightning.core.objectives import Objective, ObjectiveConfig, ObjectiveInputs

__all__ = ["StepLoss"]


@dataclass(frozen=True)
class StepLoss:
    """The step's loss of :attr:`objective` at :attr:`config`, plus :attr:`anchor_weight` times the behavior anchor
    (``docs/METHOD.md#the-behavior-anchor``) when it is not 0."""

    objective: Objective
    config: ObjectiveConfig
    anchor_weight: float
    reference: Callable[[StepBatch], Tensor]
    """A batch's reference token log-probs ``[B, L]``, without gradient."""

    def __call__(self, batch: StepBatch, token_logp: Tensor,
                 ref_token_logp: Tensor | None = None) -> tuple[Tensor, ObjectiveInputs]:
        """The loss of ``batch`` at the learner's token log-probs ``token_logp`` ``[B, L]`` and the inputs it was
        computed from (the reference's taken by :attr:`reference` when not given)."""
        ref = self.reference(batch) if ref_token_logp is None else ref_token_logp  # [B, L]
        inputs = objective_inputs(batch, token_logp, ref, self.objective.level)
        loss = self.objective.loss(inputs, self.config)
        if self.anchor_weight:
            loss = loss + self.anchor_weight * behavior_anchor(inputs.logp, batch.present_mask)  # all of mu's samples
        return loss, inputs

    @property
    def declared(self) -> bool:
        """Whether the objective declares its denominator: shares of whole groups are then exact."""
        return self.objective.denominator is not None

    def denominators(self, batch: StepBatch) -> tuple[Tensor, Tensor]:
        """The objective's and the anchor's counts on ``batch`` (0-d each), from its masks and lengths only."""
        present = torch.ones_like(batch.group_mask) if batch.present_mask is None else batch.present_mask  # [G, K]
        return self.objective.denominator(batch.group_mask, batch.response_lengths()), anchored_groups(present)

    def share(self, part: StepBatch, token_logp: Tensor, ref_token_logp: Tensor,
              step_denominators: tuple[Tensor, Tensor]) -> Tensor:
        """The share of the step's loss of ``part`` (whole groups of the step, :meth:`StepBatch.select`), at its
        learner and reference token log-probs ``[b, l]``; ``step_denominators``: :meth:`denominators` of the step."""
        inputs = objective_inputs(part, token_logp, ref_token_logp, self.objective.level)
        (own, own_anchor), (total, total_anchor) = self.denominators(part), step_denominators
        loss = self.objective.loss(inputs, self.config)
        share = loss * (own.to(loss.dtype) / total.clamp(min=1).to(loss.dtype))
        if self.anchor_weight:
            anchor = behavior_anchor(inputs.logp, part.present_mask)
            share = share + self.anchor_weight * anchor * (own_anchor.to(anchor.dtype)
                                                           / total_anchor.clamp(min=1).to(anchor.dtype))
        return share
