"""One training step's metrics from the tensors the loss was computed on (``docs/METHOD.md#diagnostics``).

Pure torch: the glue adds the rollout's counts (:meth:`RolloutBatch.metrics
<ggpo_lightning.rollouts.source.RolloutBatch.metrics>`), reduces over ranks and logs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ggpo_lightning.core.batch import StepBatch
from ggpo_lightning.core.distributed import gather_rows
from ggpo_lightning.core.drift import behavior_anchor, coverage_diagnostics, coverage_rows, drift_diagnostics
from ggpo_lightning.core.objectives import ObjectiveInputs, ggpo_diagnostics

__all__ = ["coverage_metrics", "step_metrics"]


def step_metrics(inputs: ObjectiveInputs, loss: Tensor, batch: StepBatch, step: int, beta: float) -> dict[str, Tensor]:
    """``loss``; GGPO's diagnostics at ``beta`` (for every objective); ``behavior_anchor`` (the anchor term itself,
    whether on or off, over every present response); ``reward`` and ``accuracy`` (share of reward 1) over the
    responses the objective sees; ``staleness`` and ``staleness_max`` of the groups (``step - versions``); the
    responses' ``response_length`` (mean tokens) and ``response_length_max``, ``response_tokens`` (the step's,
    all ranks), ``truncated_share`` (cut at ``max_new_tokens``) and ``sample_entropy`` (mean ``-log mu`` of the sampled tokens:
    the behavior's per-token entropy at temperature 1, estimated on its samples); with recorded behavior log-probs,
    the drift of the learner from the behavior (:func:`~ggpo_lightning.core.drift.drift_diagnostics`)."""
    mask, rewards = inputs.mask, inputs.rewards  # [G, K]
    present = batch.group_mask if batch.present_mask is None else batch.present_mask  # [G, K]
    n = mask.sum().clamp(min=1)  # []
    logp = inputs.logp.detach()  # [G, K]
    staleness = (step - batch.versions).float()  # [G]
    lengths = batch.target_mask.sum(-1).float()  # [B]
    tokens = lengths.sum()  # []
    metrics = {
        "loss": loss.detach(),
        **ggpo_diagnostics(logp, inputs.ref_logp, rewards, beta, mask),
        "behavior_anchor": behavior_anchor(logp, present),
        "reward": (rewards * mask).sum() / n,
        "accuracy": ((rewards == 1) & mask).sum() / n,
        "staleness": staleness.mean(),
        "staleness_max": staleness.max(),
        "response_length": lengths.mean(),
        "response_length_max": lengths.max(),
        "response_tokens": tokens,
    }
    if batch.truncated is not None:
        metrics["truncated_share"] = (batch.truncated & present).sum() / present.sum().clamp(min=1)
    if batch.behavior_token_logp is not None:
        metrics["sample_entropy"] = -batch.behavior_token_logp.sum() / tokens.clamp(min=1)
    if inputs.behavior_logp is not None:
        metrics.update(drift_diagnostics(logp, inputs.behavior_logp, inputs.ref_logp, rewards, mask).as_dict())
    return metrics


def coverage_metrics(token_logp: Tensor, batch: StepBatch) -> dict[str, Tensor]:
    """:func:`~ggpo_lightning.core.drift.coverage_diagnostics` of the whole step, every process's responses gathered
    (exact: the max, the percentile and the ESS of all of them, the same value on every rank; nothing to average
    after). ``token_logp`` ``[B, L]``: the learner's token log-probs of ``batch``. A collective: every rank calls it;
    {} when the step has no recorded behavior log-probs or no valid response."""
    present = batch.group_mask if batch.present_mask is None else batch.present_mask  # [G, K]
    if batch.behavior_token_logp is None:
        rows = torch.zeros((0, 3), dtype=torch.float64, device=token_logp.device)  # [0, 3]: still gathered
    else:
        rows = coverage_rows(token_logp, batch.behavior_token_logp, batch.target_mask,
                             batch.group_mask[present])  # [N, 3]
    return coverage_diagnostics(gather_rows(rows))
