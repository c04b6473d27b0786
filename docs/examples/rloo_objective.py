"""A new objective in one file: RLOO (REINFORCE with a leave-one-out baseline).

Importing this module registers it; then ``--model.objective.name rloo`` trains with it:
``PYTHONPATH=docs/examples ggpo-train --config recipes/quickstart.yaml --objective_module rloo_objective
--model.objective.name rloo`` (docs/ADDING_AN_OBJECTIVE.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ggpo_lightning.core.objectives import Objective, ObjectiveConfig, ObjectiveInputs, register_objective


def rloo_loss(inputs: ObjectiveInputs, config: ObjectiveConfig) -> Tensor:
    """``-(1/G) sum_g (1/K) sum_i (r_i - mean_{j != i} r_j) * log pi(y_i)``: on-policy REINFORCE, each
    response's baseline the mean reward of the others in its group (groups of fewer than 2 give 0)."""
    mask = inputs.mask  # [G, K]
    rewards = torch.where(mask, inputs.rewards, torch.zeros_like(inputs.rewards))  # [G, K]
    n = mask.sum(-1, keepdim=True)  # [G, 1]
    baseline = (rewards.sum(-1, keepdim=True) - rewards) / (n - 1).clamp(min=1)  # [G, K]
    advantage = torch.where(mask & (n >= 2), rewards - baseline, torch.zeros_like(rewards))  # [G, K]
    per_group = -(advantage * inputs.logp).sum(-1) / n.squeeze(-1).clamp(min=1)  # [G]
    return per_group.mean()


register_objective(Objective("rloo", rloo_loss, level="sequence"))  # REINFORCE, leave-one-out baseline (on-policy)
