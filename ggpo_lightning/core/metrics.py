"""One training step's metrics from the tensors the loss was computed on (``docs/METHOD.md#diagnostics``).

Pure torch: the glue adds the rollout's counts (:meth:`RolloutBatch.metrics
<ggpo_lightning.rollouts.source.RolloutBatch.metrics>`), reduces over ranks and logs.
"""

from __future__ import annotations

from torch import Tensor

from ggpo_lightning.core.drift import behavior_anchor, drift_diagnostics
from ggpo_lightning.core.objectives import ObjectiveInputs, ggpo_diagnostics

__all__ = ["step_metrics"]


def step_metrics(inputs: ObjectiveInputs, loss: Tensor, versions: Tensor, step: int, beta: float) -> dict[str, Tensor]:
    """``loss``; GGPO's diagnostics at ``beta`` (for every objective); ``behavior_anchor`` (the anchor term itself,
    whether on or off); ``reward`` and ``accuracy`` (share of reward 1) over the present responses; ``staleness`` and
    ``staleness_max`` of the groups (``step - versions``); with recorded behavior log-probs, the drift of the learner
    from the behavior (:func:`~ggpo_lightning.core.drift.drift_diagnostics`)."""
    mask, rewards = inputs.mask, inputs.rewards  # [G, K]
    n = mask.sum().clamp(min=1)  # []
    logp = inputs.logp.detach()  # [G, K]
    staleness = (step - versions).float()  # [G]
    metrics = {
        "loss": loss.detach(),
        **ggpo_diagnostics(logp, inputs.ref_logp, rewards, beta, mask),
        "behavior_anchor": behavior_anchor(logp, mask),
        "reward": (rewards * mask).sum() / n,
        "accuracy": ((rewards == 1) & mask).sum() / n,
        "staleness": staleness.mean(),
        "staleness_max": staleness.max(),
    }
    if inputs.behavior_logp is not None:
        metrics.update(drift_diagnostics(logp, inputs.behavior_logp, inputs.ref_logp, rewards, mask).as_dict())
    return metrics
