"""Objectives that learn from lagged rollouts: prime-rl's default loss, M2PO, OAPL and VESPO (tensor functions).

GGPO's rivals from its own family (``docs/METHOD.md#objectives-that-embrace-lagged-data``): each trains on the
samples of a behavior ``mu`` that lags the learner ``pi``, and each reads the behavior's recorded log-probs, where
GGPO reads none. Shapes follow ``ggpo_lightning/core/objectives.py``: ``[G, K]`` per response, ``[G, K, T]`` per
token; masked entries never change a value nor receive gradient.

They ship with the package as entry points of ``ggpo.objectives`` (``pyproject.toml``): this module imports the
registry's module, so the registry cannot import it back; an entry point registers each objective the first time a
recipe, ``get_objective`` or ``available_objectives`` names it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ggpo_lightning.core.objectives import (
    Objective,
    ObjectiveConfig,
    ObjectiveInputs,
    _group_mean,
    _mean_over_groups,
    check_groups,
    check_rewards,
    compute_dtype,
    contrasted_groups,
    contrasted_tokens,
    grpo_advantages,
)

__all__ = ["M2PO", "M2PO_THRESHOLD", "OAPL", "OAPL_VALUE_BETA", "PRIME_RL", "VESPO", "VESPO_SHAPES", "m2po_loss",
           "m2po_mask", "oapl_loss", "prime_rl_loss", "vespo_loss", "vespo_weights"]

M2PO_THRESHOLD = 0.04
"""M2PO's ``tau_M2`` when ``model.objective.m2_threshold`` is null: AReaL's M2PO example (``actor.m2_threshold``)."""
VESPO_SHAPES = ((2.0, 3.0), (3.0, 2.0))
"""VESPO's ``(k, lambda)`` for advantages ``>= 0`` and ``< 0``: TRL's ``vespo_k_pos``, ``vespo_lambda_pos``,
``vespo_k_neg``, ``vespo_lambda_neg`` (the paper's ``c1``, ``c2``)."""
OAPL_VALUE_BETA = 1.0
"""OAPL's ``beta_1`` (the optimal value's temperature) when ``model.objective.oapl_value_beta`` is null: the
authors' released training script (``critic.beta1``)."""


def _token_inputs(token_logp: Tensor, behavior_token_logp: Tensor, token_mask: Tensor, rewards: Tensor,
                  group_mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Checked token inputs: (learner ``lp``, behavior ``mu``, ``valid`` tokens, group ``mask``), the first three
    ``[G, K, T]`` with 0 off ``valid`` (response tokens of groups with at least two responses)."""
    if token_logp.dim() != 3 or token_logp.shape[:2] != rewards.shape:
        raise ValueError(f"token_logp must have shape [G, K, T] with [G, K] = rewards' {tuple(rewards.shape)}, "
                         f"got {tuple(token_logp.shape)}")
    for name, t in (("behavior_token_logp", behavior_token_logp), ("token_mask", token_mask)):
        if t is None or t.shape != token_logp.shape:
            raise ValueError(f"{name} must have token_logp's shape {tuple(token_logp.shape)}, got "
                             f"{None if t is None else tuple(t.shape)}")
    if token_mask.dtype != torch.bool:
        raise ValueError(f"token_mask must be a bool tensor, got {token_mask.dtype}")
    mask = check_groups(group_mask, rewards=rewards)  # [G, K]
    check_rewards(rewards, mask)
    dtype = compute_dtype(token_logp)
    zero = torch.zeros((), dtype=dtype, device=token_logp.device)
    n = mask.sum(-1, keepdim=True)  # [G, 1]
    valid = token_mask & (mask & (n >= 2)).unsqueeze(-1)  # [G, K, T]
    lp = torch.where(valid, token_logp.to(dtype), zero)  # [G, K, T]
    mu = torch.where(valid, behavior_token_logp.to(dtype), zero)  # [G, K, T]
    return lp, mu, valid, mask


def _token_mean(per_token: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``per_token`` ``[G, K, T]`` over the ``valid`` tokens (0-d; 0 with a graph when none)."""
    kept = torch.where(valid, per_token, torch.zeros_like(per_token))  # [G, K, T]
    return kept.sum() / valid.sum().clamp(min=1).to(per_token.dtype)


# ----------------------------------------------------------------------------- prime-rl


def prime_rl_loss(token_logp: Tensor, behavior_token_logp: Tensor, token_mask: Tensor, rewards: Tensor,
                  group_mask: Tensor | None = None, mask_threshold: float = 0.2, kl_coef: float = 1e-3) -> Tensor:
    """prime-rl's default RL loss: DPPO-style masked importance-weighted policy gradient plus ``log^2(pi / mu)``.

    With ``A_i = r_i - mean r`` (the group's mean, no std), ``rho_t = pi(y_t) / mu(y_t)`` (with gradient) and
    ``delta_t = pi(y_t) - mu(y_t)`` (probabilities, without gradient), a token is dropped from the policy term when
    it already moved past ``mask_threshold`` (``eps``) in its advantage's direction::

        M_t    = 0 if (A_i > 0 and delta_t > eps) or (A_i <= 0 and delta_t < -eps), else 1
        loss_t = -M_t * A_i * rho_t + kl_coef * (log pi(y_t) - log mu(y_t))^2

    averaged over the valid tokens (dropped ones included) of groups with at least two responses. The gradient at
    a token is ``(-M_t * A_i * rho_t + 2 * kl_coef * log rho_t) * grad log pi(y_t)`` over that count.
    """
    lp, mu, valid, mask = _token_inputs(token_logp, behavior_token_logp, token_mask, rewards, group_mask)
    adv = grpo_advantages(rewards.to(lp.dtype), mask, scale_by_std=False).unsqueeze(-1)  # [G, K, 1]
    log_ratio = lp - mu  # [G, K, T]
    delta = lp.detach().exp() - mu.exp()  # [G, K, T]
    dropped = torch.where(adv > 0, delta > mask_threshold, delta < -mask_threshold)  # [G, K, T]
    policy = torch.where(dropped, torch.zeros_like(log_ratio), adv * log_ratio.exp())  # [G, K, T]
    return _token_mean(-policy + kl_coef * log_ratio * log_ratio, valid)


# ----------------------------------------------------------------------------- M2PO


@torch.no_grad()
def m2po_mask(token_logp: Tensor, behavior_token_logp: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """M2PO's second-moment mask, bool ``[G, K, T]``: True for the tokens kept.

    With ``m_t = (log pi(y_t) - log mu(y_t))^2`` over the ``valid`` tokens, the tokens of largest ``m_t`` are dropped
    one at a time until the mean ``m_t`` of the rest is below ``threshold`` (``tau_M2``); if no such rest exists,
    only the token of smallest ``m_t`` is kept (AReaL's rule). The mask is a statistic of the whole step's tokens.
    """
    m2 = (token_logp - behavior_token_logp)[valid] ** 2  # [N]
    kept = torch.ones_like(m2, dtype=torch.bool)  # [N]
    if m2.numel() > 0:
        order = torch.argsort(m2, descending=True)  # [N]
        rest = m2[order].flip(0).cumsum(0).flip(0)  # [N]: sum of m2 from each sorted position on
        rest_mean = rest / torch.arange(m2.numel(), 0, -1, dtype=m2.dtype, device=m2.device)  # [N]
        below = (rest_mean < threshold).nonzero()  # [B, 1]
        dropped = int(below[0, 0]) if below.numel() else m2.numel() - 1
        kept[order[:dropped]] = False
    out = torch.zeros_like(valid)  # [G, K, T]
    out[valid] = kept
    return out


def m2po_loss(token_logp: Tensor, behavior_token_logp: Tensor, token_mask: Tensor, rewards: Tensor,
              group_mask: Tensor | None = None, threshold: float = M2PO_THRESHOLD) -> Tensor:
    """M2PO: GRPO without a trust region whose tokens of largest ``(log pi/mu)^2`` are masked (:func:`m2po_mask`).

    With GRPO's advantage ``A_i = (r_i - mean r) / (std r + 1e-4)`` and ``rho_t = pi(y_t) / mu(y_t)`` (no clip)::

        loss_t = -M_t * rho_t * A_i

    averaged over the valid tokens (masked ones included) of groups with at least two responses; no KL term. The
    gradient at a kept token is ``-rho_t * A_i * grad log pi(y_t)`` over that count.
    """
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
    lp, mu, valid, mask = _token_inputs(token_logp, behavior_token_logp, token_mask, rewards, group_mask)
    adv = grpo_advantages(rewards.to(lp.dtype), mask).unsqueeze(-1)  # [G, K, 1]
    kept = m2po_mask(lp, mu, valid, threshold)  # [G, K, T]
    surrogate = torch.where(kept, (lp - mu).exp() * adv, torch.zeros_like(lp))  # [G, K, T]
    return _token_mean(-surrogate, valid)


# ----------------------------------------------------------------------------- OAPL


def oapl_loss(logp: Tensor, behavior_logp: Tensor, rewards: Tensor, beta: float, value_beta: float = OAPL_VALUE_BETA,
              mask: Tensor | None = None) -> Tensor:
    """OAPL: squared regression of ``beta * log(pi / mu)`` on the optimal advantage, per response.

    The group's optimal value is estimated from its own rewards, ``V* = value_beta * log((1/K) * sum_j
    exp(r_j / value_beta))``, and each response's residual ``beta * (log pi(y_i) - log mu(y_i)) - (r_i - V*)`` is
    squared::

        L_group = (1/K) * sum_i (beta * (log pi(y_i) - log mu(y_i)) - (r_i - V*))^2

    averaged over the groups with at least two responses. The gradient is ``(2 * beta / K) * residual_i *
    grad log pi(y_i)`` per group. ``logp``, ``behavior_logp`` (the lagged policy's sequence log-probs) and
    ``rewards`` are ``[G, K]``.
    """
    for name, value in (("beta", beta), ("value_beta", value_beta)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    mask = check_groups(mask, logp=logp, behavior_logp=behavior_logp, rewards=rewards)  # [G, K]
    check_rewards(rewards, mask)
    dtype = compute_dtype(logp)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    r = torch.where(mask, rewards.to(dtype), zero)  # [G, K]
    n = mask.sum(-1, keepdim=True).clamp(min=1).to(dtype)  # [G, 1]
    scaled = torch.where(mask, r / value_beta, torch.full((), -math.inf, dtype=dtype, device=r.device))  # [G, K]
    scaled = torch.where(mask.any(-1, keepdim=True), scaled, zero)  # [G, K]: an empty group's row stays finite
    value = value_beta * (torch.logsumexp(scaled, dim=-1, keepdim=True) - n.log())  # [G, 1]
    log_ratio = logp.to(dtype) - behavior_logp.to(dtype)  # [G, K]
    residual = torch.where(mask, beta * log_ratio - (r - value), zero)  # [G, K]
    per_group, count = _group_mean(residual * residual, mask)  # [G], [G]
    return _mean_over_groups(per_group, count)


# ----------------------------------------------------------------------------- VESPO


@torch.no_grad()
def vespo_weights(token_logp: Tensor, behavior_token_logp: Tensor, valid: Tensor, advantages: Tensor,
                  shapes: tuple[tuple[float, float], tuple[float, float]] = VESPO_SHAPES) -> Tensor:
    """VESPO's gamma weights ``phi(W_i)``, ``[G, K]``, without gradient: with the response's ratio
    ``W_i = prod_t pi(y_t) / mu(y_t)`` and ``(k, lambda)`` from ``shapes`` by the sign of ``A_i``::

        phi(W) = W^k * exp(lambda * (1 - W))        (phi(1) = 1, largest at W = k / lambda)

    computed on ``log W`` clamped to ``[log 1e-8, 20]`` as TRL does. ``valid`` is ``[G, K, T]``, ``advantages``
    ``[G, K]``."""
    (k_pos, lambda_pos), (k_neg, lambda_neg) = shapes
    zero = torch.zeros((), dtype=token_logp.dtype, device=token_logp.device)
    log_w = torch.where(valid, token_logp - behavior_token_logp, zero).sum(-1)  # [G, K]
    log_w = log_w.clamp(math.log(1e-8), 20.0)  # [G, K]
    k = torch.where(advantages >= 0, k_pos, k_neg)  # [G, K]
    lam = torch.where(advantages >= 0, lambda_pos, lambda_neg)  # [G, K]
    return (lam + k * log_w - lam * log_w.exp()).exp()  # [G, K]


def vespo_loss(token_logp: Tensor, behavior_token_logp: Tensor, token_mask: Tensor, rewards: Tensor,
               group_mask: Tensor | None = None,
               shapes: tuple[tuple[float, float], tuple[float, float]] = VESPO_SHAPES) -> Tensor:
    """VESPO: GRPO's advantage times a smooth, detached weight of the response's whole ratio ``pi / mu``.

    With GRPO's ``A_i`` and :func:`vespo_weights` ``phi(W_i)``::

        loss_t = -phi(W_i) * A_i * log pi(y_t),        dL / d log pi(y_t) = -phi(W_i) * A_i / N

    averaged over the ``N`` valid tokens of groups with at least two responses; no clip, no KL term. ``phi`` takes
    both tails of ``W`` to 0: as ``W^k`` towards 0, exponentially above 1.
    """
    lp, mu, valid, mask = _token_inputs(token_logp, behavior_token_logp, token_mask, rewards, group_mask)
    adv = grpo_advantages(rewards.to(lp.dtype), mask)  # [G, K]
    phi = vespo_weights(lp.detach(), mu, valid, adv, shapes)  # [G, K]
    return _token_mean(-(phi * adv).unsqueeze(-1) * lp, valid)


# ----------------------------------------------------------------------------- registry entries


def _prime_rl(x: ObjectiveInputs, c: ObjectiveConfig) -> Tensor:
    return prime_rl_loss(x.token_logp, x.behavior_token_logp, x.token_mask, x.rewards, x.mask,
                         mask_threshold=c.clip_eps, kl_coef=c.beta)


def _vespo(x: ObjectiveInputs, c: ObjectiveConfig) -> Tensor:
    return vespo_loss(x.token_logp, x.behavior_token_logp, x.token_mask, x.rewards, x.mask)


def _m2po(x: ObjectiveInputs, c: ObjectiveConfig) -> Tensor:
    threshold = M2PO_THRESHOLD if c.m2_threshold is None else c.m2_threshold
    return m2po_loss(x.token_logp, x.behavior_token_logp, x.token_mask, x.rewards, x.mask, threshold=threshold)


def _oapl(x: ObjectiveInputs, c: ObjectiveConfig) -> Tensor:
    value_beta = OAPL_VALUE_BETA if c.oapl_value_beta is None else c.oapl_value_beta
    return oapl_loss(x.logp, x.behavior_logp, x.rewards, c.beta, value_beta, x.mask)


PRIME_RL = Objective("prime_rl", _prime_rl, "token", uses_behavior_logp=True, denominator=contrasted_tokens)
"""prime-rl's default loss (``clip_eps``: its DPPO mask threshold, ``beta``: its ``kl_tau``)."""
M2PO = Objective("m2po", _m2po, "token", uses_behavior_logp=True, options=("m2_threshold",))
"""M2PO; its mask is a statistic of the step's tokens, so no denominator is declared (micro-batches: two passes)."""
OAPL = Objective("oapl", _oapl, "token", uses_behavior_logp=True, options=("oapl_value_beta",),
                 denominator=contrasted_groups)
"""OAPL (``beta``: its ``beta_2``); reads the behavior's sequence log-probs, hence ``level="token"``."""
VESPO = Objective("vespo", _vespo, "token", uses_behavior_logp=True, denominator=contrasted_tokens)
"""VESPO at TRL's defaults (:data:`VESPO_SHAPES`; no setting of its own)."""
