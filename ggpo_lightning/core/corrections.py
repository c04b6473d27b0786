"""GRPO's corrections for stale rollouts (``docs/METHOD.md#corrections-for-stale-rollouts``), as pure tensor functions:
importance weights from the behavior ``mu`` to ``pi_old`` (truncated or masked, per token or per response: the four
:data:`IS_MODES`), DeepSeek-V3.2's off-policy sequence mask, the two applied to a surrogate
(:func:`corrected_surrogate`, what :func:`~ggpo_lightning.core.objectives.grpo_loss` calls), and the errors of their
settings, each naming its recipe key.

Shapes: ``[G, K, T]`` token tensors of ``G`` groups of ``K`` responses of up to ``T`` tokens; ``valid`` bool
``[G, K, T]`` marks the tokens that count.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["IS_MODES", "corrected_surrogate", "correction_errors", "importance_weights", "off_policy_sequence_mask"]

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""GRPO's importance-sampling corrections (TRL's ``vllm_importance_sampling_mode`` values;
docs/METHOD.md#corrections-for-stale-rollouts)."""


def importance_weights(old_token_logp: Tensor, behavior_token_logp: Tensor, valid: Tensor, mode: str,
                       clip_max: float, clip_min: float | None = None) -> Tensor:
    """Importance weights ``w`` from the behavior ``mu`` to ``pi_old``, shape ``[G, K, T]``, without gradient.

    With ``rho = pi_old / mu`` per token (``token_*``), or per response ``rho_i = prod_t pi_old(y_t) / mu(y_t)``
    broadcast to its tokens (``sequence_*``), and bounds ``[clip_min, clip_max]`` (``clip_min`` None: no lower bound)::

        *_truncate:  w = min(max(rho, clip_min), clip_max)        (TIS; without clip_min: min(rho, C))
        *_mask:      w = rho if clip_min <= rho <= clip_max else 0  (masked IS; IcePop: token_mask, [0.5, 5])

    Computed on log-ratios, so a sequence ratio beyond float range is truncated or masked, never inf or NaN.
    ``valid`` (bool ``[G, K, T]``) marks the tokens that count; 0 elsewhere.
    """
    if mode not in IS_MODES:
        raise ValueError(f"importance_sampling must be one of {IS_MODES}, got {mode!r}")
    log_max, log_min = math.log(clip_max), math.log(clip_min) if clip_min else -math.inf  # None or 0: no bound
    zero = torch.zeros((), dtype=old_token_logp.dtype, device=old_token_logp.device)
    log_rho = torch.where(valid, old_token_logp.detach() - behavior_token_logp, zero)  # [G, K, T]
    if mode.startswith("sequence"):
        log_rho = log_rho.sum(-1, keepdim=True).expand_as(log_rho)  # [G, K, T]: the response's log-ratio
    if mode.endswith("truncate"):
        weights = log_rho.clamp(min=log_min, max=log_max).exp()  # [G, K, T]
    else:
        kept = (log_rho >= log_min) & (log_rho <= log_max)  # [G, K, T]
        weights = torch.where(kept, log_rho.clamp(max=log_max).exp(), zero)  # [G, K, T]
    return torch.where(valid, weights, zero).detach()


def off_policy_sequence_mask(old_token_logp: Tensor, behavior_token_logp: Tensor, valid: Tensor, advantages: Tensor,
                             threshold: float) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask, bool ``[G, K]``: False for the responses dropped.

    A response is dropped when its advantage is negative and its mean per-token ``KL(mu || pi_old)``, estimated on
    its own tokens as ``(1/|y_i|) * sum_t (log mu(y_t) - log pi_old(y_t))``, exceeds ``threshold`` (delta)::

        keep_i = A_i >= 0  or  (1/|y_i|) * sum_t (log mu - log pi_old) <= delta

    ``valid`` (bool ``[G, K, T]``) marks the tokens that count; ``advantages`` is ``[G, K]``.
    """
    zero = torch.zeros((), dtype=old_token_logp.dtype, device=old_token_logp.device)
    diff = torch.where(valid, behavior_token_logp - old_token_logp.detach(), zero)  # [G, K, T]
    kl = diff.sum(-1) / valid.sum(-1).clamp(min=1).to(diff.dtype)  # [G, K]
    return (advantages >= 0) | (kl <= threshold)  # [G, K]


def corrected_surrogate(surrogate: Tensor, old_token_logp: Tensor, behavior_token_logp: Tensor, valid: Tensor,
                        advantages: Tensor, importance_sampling: str | None, clip_max: float, clip_min: float | None,
                        off_policy_mask_threshold: float | None) -> Tensor:
    """``surrogate`` (``[G, K, T]``) weighted by :func:`importance_weights` (with ``importance_sampling``), then 0 for
    the responses :func:`off_policy_sequence_mask` drops (with ``off_policy_mask_threshold``); unchanged with both off.
    ``advantages``: ``[G, K]``."""
    zero = torch.zeros((), dtype=surrogate.dtype, device=surrogate.device)
    if importance_sampling is not None:
        surrogate = surrogate * importance_weights(old_token_logp, behavior_token_logp, valid, importance_sampling,
                                                   clip_max, clip_min)  # [G, K, T]
    if off_policy_mask_threshold is not None:
        keep = off_policy_sequence_mask(old_token_logp, behavior_token_logp, valid, advantages,
                                        off_policy_mask_threshold)  # [G, K]
        surrogate = torch.where(keep.unsqueeze(-1), surrogate, zero)  # [G, K, T]
    return surrogate


def correction_errors(importance_sampling: str | None, clip_max: float, clip_min: float | None,
                      off_policy_mask_threshold: float | None, prefix: str = "") -> list[str]:
    """Every invalid setting of GRPO's corrections, each naming its key (``prefix`` + the argument's name)."""
    errors = []
    if importance_sampling is not None and importance_sampling not in IS_MODES:
        errors.append(f"{prefix}importance_sampling must be one of {', '.join(IS_MODES)} or null (off), "
                      f"got {importance_sampling!r}")
    if not (isinstance(clip_max, (int, float)) and math.isfinite(clip_max) and clip_max > 0):
        errors.append(f"{prefix}importance_sampling_clip_max must be a finite number > 0, got {clip_max!r}")
    elif clip_min is not None and not (isinstance(clip_min, (int, float)) and 0 <= clip_min < clip_max):
        errors.append(f"{prefix}importance_sampling_clip_min must be >= 0 and below importance_sampling_clip_max "
                      f"({clip_max}), or null, got {clip_min!r}")
    if clip_min is not None and importance_sampling is None:
        errors.append(f"{prefix}importance_sampling_clip_min is set but {prefix}importance_sampling is null: "
                      "set a mode, or remove the bound")
    if off_policy_mask_threshold is not None and not (isinstance(off_policy_mask_threshold, (int, float))
                                                      and math.isfinite(off_policy_mask_threshold)
                                                      and off_policy_mask_threshold >= 0):
        errors.append(f"{prefix}off_policy_mask_threshold must be a finite number >= 0, or null (off), "
                      f"got {off_policy_mask_threshold!r}")
    return errors
