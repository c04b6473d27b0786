"""Policy-optimization objectives as pure tensor functions (no Lightning).

Shapes follow one convention: a batch holds ``G`` prompt groups of up to ``K``
responses each. Sequence-level objectives (GGPO, AGRO, MaxRL) take ``[G, K]``
tensors of *sequence* log-probabilities (sum of a response's token log-probs);
GRPO takes ``[G, K, T]`` token log-probabilities. ``mask`` / ``group_mask`` is a
bool ``[G, K]`` tensor, True where a response is present, so groups of different
sizes share one padded tensor. Masked entries never change a loss value and never
receive gradient, whatever they hold (NaN and inf included).

Every objective averages over the groups that carry signal: groups with fewer than
two valid responses have nothing to contrast, contribute 0 and are left out of the
mean. All losses are returned as 0-d tensors and are minimized.

The formulas are derived in ``docs/METHOD.md`` (``#the-objective``, ``#the-gradient``,
``#baselines``). The adjusted reward is
``a_i = r_i - beta * (log pi_theta(y_i) - log pi_ref(y_i))``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

import torch
from torch import Tensor

from ggpo_lightning.core.corrections import IS_MODES, corrected_surrogate, correction_errors
from ggpo_lightning.records.errors import SettingsError

__all__ = [
    "Objective",
    "ObjectiveConfig",
    "ObjectiveInputs",
    "agro_loss",
    "available_objectives",
    "check_groups",
    "check_rewards",
    "compute_dtype",
    "contrasted_groups",
    "contrasted_tokens",
    "get_objective",
    "ggpo_diagnostics",
    "ggpo_group_loss",
    "ggpo_loss",
    "ggpo_weights",
    "grpo_loss",
    "import_objective_modules",
    "maxrl_loss",
    "register_objective",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
CORRECTION_OPTIONS = ("importance_sampling", "importance_sampling_clip_min", "off_policy_mask_threshold")
"""GRPO's options among :data:`SWITCHED_OPTIONS`."""
SWITCHED_OPTIONS = CORRECTION_OPTIONS + ("m2_threshold", "oapl_value_beta")
"""``ObjectiveConfig`` options that are off (or the objective's default) when null: setting one for an objective
that does not take it is an error."""


# ----------------------------------------------------------------------------- checks


def _check_beta(beta: float | Tensor) -> None:
    value = float(beta)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"beta must be a finite number > 0, got {value!r}")


def check_groups(mask: Tensor | None, **tensors: Tensor) -> Tensor:
    """Check that the named ``[G, K]`` tensors agree in shape; return the bool mask."""
    names = list(tensors)
    first = tensors[names[0]]
    if first.dim() != 2:
        raise ValueError(
            f"{names[0]} must have shape [G, K] (groups x responses), got {tuple(first.shape)}"
        )
    for name in names[1:]:
        if tensors[name].shape != first.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensors[name].shape)} but {names[0]} has "
                f"{tuple(first.shape)}; both must be [G, K]"
            )
    if mask is None:
        return torch.ones(first.shape, dtype=torch.bool, device=first.device)
    if mask.shape != first.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but {names[0]} has {tuple(first.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = response present), got {mask.dtype}")
    return mask


def check_rewards(rewards: Tensor, mask: Tensor) -> None:
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor, got {rewards.dtype}")
    bad = mask & ~torch.isfinite(rewards)
    if bool(bad.any()):
        g, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"rewards must be finite where mask is True; rewards[{g}, {k}] = {rewards[g, k].item()}"
        )


def compute_dtype(x: Tensor) -> torch.dtype:
    # bf16/fp16 log-probs lose the adjusted reward's small differences; fp64 stays fp64.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------- helpers


def _adjusted_rewards(logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float | Tensor, mask: Tensor) -> Tensor:
    """``a = r - beta * (logp - ref_logp)`` where valid, exactly 0 elsewhere (no gradient leaks)."""
    dtype = compute_dtype(logp)
    a = rewards.to(dtype) - beta * (logp.to(dtype) - ref_logp.to(dtype))  # [G, K]
    return torch.where(mask, a, torch.zeros((), dtype=dtype, device=a.device))


def _group_mean(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Masked mean over K of a ``[G, K]`` tensor whose masked entries are 0; returns (mean [G], n [G])."""
    n = mask.sum(dim=-1)  # [G]
    return x.sum(dim=-1) / n.clamp(min=1).to(x.dtype), n


def _mean_over_groups(per_group: Tensor, n: Tensor) -> Tensor:
    """Mean of ``per_group`` over groups with at least 2 responses; 0 (with a graph) if none."""
    keep = n >= 2  # [G]
    zero = torch.zeros((), dtype=per_group.dtype, device=per_group.device)
    return torch.where(keep, per_group, zero).sum() / keep.sum().clamp(min=1).to(per_group.dtype)


def _centered_logits(a: Tensor, beta: float | Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(a - mean a) / beta`` with masked entries at -inf; returns (z [G, K], mean a [G], n [G]).

    Centering first keeps ``beta * logsumexp(z) - mean(a)`` free of cancellation when
    ``|a|`` is large (log-probs of -5000 at beta 1e-3 give |a/beta| ~ 5e6). Groups with
    no valid entry get all-zero logits, so logsumexp's backward never sees an all -inf row
    (whose softmax is NaN and would leak through ``torch.where``).
    """
    mean_a, n = _group_mean(a, mask)  # [G], [G]
    z = (a - mean_a.unsqueeze(-1)) / beta  # [G, K]
    z = torch.where(mask, z, torch.full((), -math.inf, dtype=z.dtype, device=z.device))
    return torch.where((n > 0).unsqueeze(-1), z, torch.zeros_like(z)), mean_a, n


# ----------------------------------------------------------------------------- GGPO


def ggpo_group_loss(
    logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float | Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Per-group GGPO loss ``L_K`` and the group sizes, shapes ``[G]`` and ``[G]``.

    ``L_K = beta * log((1/K) * sum_i exp(a_i / beta)) - (1/K) * sum_i a_i``, with K the
    number of valid responses of the group; groups with fewer than 2 give 0.
    """
    _check_beta(beta)
    mask = check_groups(mask, logp=logp, ref_logp=ref_logp, rewards=rewards)
    check_rewards(rewards, mask)
    a = _adjusted_rewards(logp, ref_logp, rewards, beta, mask)  # [G, K]
    z, _, n = _centered_logits(a, beta, mask)  # [G, K]
    log_n = n.clamp(min=1).to(z.dtype).log()  # [G]
    per_group = beta * (torch.logsumexp(z, dim=-1) - log_n)  # [G]
    return torch.where(n >= 2, per_group, torch.zeros_like(per_group)), n


def ggpo_loss(
    logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float | Tensor, mask: Tensor | None = None
) -> Tensor:
    """GGPO loss: mean over groups of the "log-mean-exp minus mean" group loss.

    For a group of K behavior responses with adjusted rewards
    ``a_i = r_i - beta * (logp_i - ref_logp_i)``::

        L_K = beta * log( (1/K) * sum_i exp(a_i / beta) ) - (1/K) * sum_i a_i      (>= 0)

    and its gradient is ``-beta * sum_i (w_i - 1/K) * grad logp_i`` with
    ``w = softmax(a / beta)`` (see :func:`ggpo_weights`). No importance weights and no
    behavior log-probs are needed. Computed with ``logsumexp`` on centered adjusted
    rewards, so it stays finite and precise for ``|a / beta|`` far beyond float range of
    ``exp``.

    Args:
        logp: ``[G, K]`` learner sequence log-probs (carry the gradient).
        ref_logp: ``[G, K]`` reference sequence log-probs (no gradient expected).
        rewards: ``[G, K]`` rewards, finite where ``mask`` is True.
        beta: KL strength, > 0.
        mask: optional bool ``[G, K]``, True where a response is present.

    Returns:
        0-d tensor: mean of ``L_K`` over groups with at least 2 valid responses (groups
        with fewer contribute 0 and are excluded from the mean; 0 if there are none).
    """
    per_group, n = ggpo_group_loss(logp, ref_logp, rewards, beta, mask)
    return _mean_over_groups(per_group, n)


@torch.no_grad()
def ggpo_weights(
    logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float | Tensor, mask: Tensor | None = None
) -> Tensor:
    """Contrast weights ``w_i - 1/K`` of the GGPO update, shape ``[G, K]``.

    ``w = softmax(a / beta)`` over each group's valid responses. The descent step of
    ``L_K`` is ``-beta * sum_i (w_i - 1/K) * grad logp_i``: responses whose adjusted
    reward beats the group's soft maximum less than average are pushed down, the rest
    up. Masked entries and groups with fewer than 2 responses get 0.
    """
    _check_beta(beta)
    mask = check_groups(mask, logp=logp, ref_logp=ref_logp, rewards=rewards)
    check_rewards(rewards, mask)
    a = _adjusted_rewards(logp, ref_logp, rewards, beta, mask)
    z, _, n = _centered_logits(a, beta, mask)
    w = torch.softmax(z, dim=-1)  # [G, K], 0 at masked entries
    contrast = w - 1.0 / n.clamp(min=1).to(w.dtype).unsqueeze(-1)
    return torch.where(mask & (n >= 2).unsqueeze(-1), contrast, torch.zeros_like(contrast))


@torch.no_grad()
def ggpo_diagnostics(
    logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float | Tensor, mask: Tensor | None = None
) -> dict[str, Tensor]:
    """Diagnostics of a GGPO batch, each a 0-d tensor averaged over groups with >= 2 responses.

    - ``gibbs_gap``: the group loss ``L_K`` (on policy it is the optimality gap ``J* - J``);
    - ``ess``: effective sample size of ``w = softmax(a/beta)``, ``1 / sum_i w_i^2``;
    - ``ess_fraction``: ``ess / K`` in (0, 1], 1 when all adjusted rewards are equal;
    - ``weight_entropy``: ``-sum_i w_i log w_i`` (nats);
    - ``mixed_reward_fraction``: fraction of groups whose valid rewards are not all equal.
    """
    per_group, n = ggpo_group_loss(logp, ref_logp, rewards, beta, mask)
    mask = check_groups(mask, logp=logp)
    a = _adjusted_rewards(logp, ref_logp, rewards, beta, mask)
    z, _, _ = _centered_logits(a, beta, mask)
    w = torch.softmax(z, dim=-1)  # [G, K]
    ess = 1.0 / (w * w).sum(dim=-1)  # [G]
    entropy = -(torch.where(w > 0, w * w.log(), torch.zeros_like(w))).sum(dim=-1)  # [G]
    r = rewards.to(w.dtype)
    r_max = torch.where(mask, r, torch.full_like(r, -math.inf)).amax(dim=-1)  # [G]
    r_min = torch.where(mask, r, torch.full_like(r, math.inf)).amin(dim=-1)  # [G]
    mixed = (r_max > r_min).to(w.dtype)  # [G]
    return {
        "gibbs_gap": _mean_over_groups(per_group, n),
        "ess": _mean_over_groups(ess, n),
        "ess_fraction": _mean_over_groups(ess / n.clamp(min=1).to(w.dtype), n),
        "weight_entropy": _mean_over_groups(entropy, n),
        "mixed_reward_fraction": _mean_over_groups(mixed, n),
    }


# ----------------------------------------------------------------------------- AGRO


def agro_loss(
    logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float | Tensor, mask: Tensor | None = None
) -> Tensor:
    """AGRO loss, scaled as GGPO's local quadratic approximation.

    ``L_AGRO = (1 / (2 * beta)) * Var_mu(a)``, group form: the mean of squared deviations
    of the adjusted rewards from their group mean (divided by K, not K - 1). Its
    gradient is ``-(1/K) * sum_i (a_i - mean a) * grad logp_i``, which GGPO's matches to
    first order when ``|a_i - mean a| << beta``. Same arguments, masking and group
    averaging as :func:`ggpo_loss`.
    """
    _check_beta(beta)
    mask = check_groups(mask, logp=logp, ref_logp=ref_logp, rewards=rewards)
    check_rewards(rewards, mask)
    a = _adjusted_rewards(logp, ref_logp, rewards, beta, mask)  # [G, K]
    mean_a, n = _group_mean(a, mask)  # [G]
    dev = torch.where(mask, a - mean_a.unsqueeze(-1), torch.zeros_like(a))  # [G, K]
    var = (dev * dev).sum(dim=-1) / n.clamp(min=1).to(a.dtype)  # [G]
    return _mean_over_groups(var / (2 * beta), n)


# ----------------------------------------------------------------------------- MaxRL


def maxrl_loss(logp: Tensor, rewards: Tensor, mask: Tensor | None = None) -> Tensor:
    """MaxRL surrogate for binary rewards: its negative gradient is MaxRL's update.

    Per group with successes ``S = {i : r_i = 1}``::

        loss = -( (1/|S|) * sum_{i in S} logp_i  -  (1/K) * sum_i logp_i )

    so the descent direction is the mean score of successful responses minus the mean
    score of all responses. Groups without a success give 0 (and no gradient) but count
    in the mean, like GGPO's all-equal groups; groups with fewer than 2 responses are
    excluded. Rewards must be 0 or 1 where ``mask`` is True.
    """
    mask = check_groups(mask, logp=logp, rewards=rewards)
    check_rewards(rewards, mask)
    binary = (rewards == 0) | (rewards == 1)
    if bool((mask & ~binary).any()):
        raise ValueError("maxrl_loss needs binary rewards (0 or 1) where mask is True")
    dtype = compute_dtype(logp)
    lp = torch.where(mask, logp.to(dtype), torch.zeros((), dtype=dtype, device=logp.device))  # [G, K]
    success = mask & (rewards == 1)  # [G, K]
    n_success = success.sum(dim=-1)  # [G]
    mean_success = torch.where(success, lp, torch.zeros_like(lp)).sum(-1) / n_success.clamp(min=1).to(dtype)
    mean_all, n = _group_mean(lp, mask)  # [G]
    per_group = torch.where(n_success > 0, -(mean_success - mean_all), torch.zeros_like(mean_all))
    return _mean_over_groups(per_group, n)


# ----------------------------------------------------------------------------- GRPO


def _token_kl(token_logp: Tensor, ref_token_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman's k1/k2/k3).

    With ``d = log pi_ref - log pi_theta``: k1 = ``-d`` (unbiased, high variance, can be
    negative), k2 = ``d^2 / 2``, k3 = ``exp(d) - d - 1`` (unbiased, non-negative).
    """
    d = ref_token_logp - token_logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.exp(d) - d - 1


def grpo_advantages(rewards: Tensor, mask: Tensor, std_eps: float = 1e-4, scale_by_std: bool = True) -> Tensor:
    """Group-normalized advantages ``A_i = (r_i - mean r) / (std r + std_eps)``, shape ``[G, K]``.

    ``std`` is the sample standard deviation over the group's valid responses (K - 1 in
    the denominator, as in DeepSeekMath's and TRL's implementations). With
    ``scale_by_std=False`` the advantage is just ``r_i - mean r`` (Dr. GRPO). Masked
    entries and groups with fewer than 2 responses get 0.
    """
    r = torch.where(mask, rewards, torch.zeros_like(rewards))
    mean_r, n = _group_mean(r, mask)  # [G]
    dev = torch.where(mask, r - mean_r.unsqueeze(-1), torch.zeros_like(r))  # [G, K]
    adv = dev
    if scale_by_std:
        std = ((dev * dev).sum(-1) / (n - 1).clamp(min=1).to(r.dtype)).sqrt()  # [G]
        # dev == 0 wherever std == 0, so a zero std_eps gives 0 there, not 0/0
        adv = torch.where(dev == 0, dev, dev / (std.unsqueeze(-1) + std_eps))
    return torch.where(mask & (n >= 2).unsqueeze(-1), adv, torch.zeros_like(adv))


def _checked_grpo_inputs(token_logp: Tensor, behavior_token_logp: Tensor | None, token_mask: Tensor, rewards: Tensor,
                         group_mask: Tensor | None, clip_eps: float, kl_coef: float, ref_token_logp: Tensor | None,
                         kl_estimator: str) -> Tensor:
    """:func:`grpo_loss`'s inputs checked (a ``ValueError`` naming the first problem); the group mask (all True when
    None)."""
    if token_logp.dim() != 3:
        raise ValueError(f"token_logp must have shape [G, K, T], got {tuple(token_logp.shape)}")
    group_mask = check_groups(group_mask, rewards=rewards)
    if token_logp.shape[:2] != rewards.shape:
        raise ValueError(
            f"token_logp has shape {tuple(token_logp.shape)} but rewards has {tuple(rewards.shape)}; "
            "the first two dimensions must be [G, K]"
        )
    for name, t in (("behavior_token_logp", behavior_token_logp), ("token_mask", token_mask),
                    ("ref_token_logp", ref_token_logp)):
        if t is not None and t.shape != token_logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but token_logp has {tuple(token_logp.shape)}")
    if token_mask.dtype != torch.bool:
        raise ValueError(f"token_mask must be a bool tensor, got {token_mask.dtype}")
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
    if kl_coef > 0 and ref_token_logp is None:
        raise ValueError("kl_coef > 0 needs ref_token_logp (reference token log-probs)")
    return group_mask


def grpo_loss(
    token_logp: Tensor,
    behavior_token_logp: Tensor | None,
    token_mask: Tensor,
    rewards: Tensor,
    group_mask: Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_token_logp: Tensor | None = None,
    kl_estimator: str = "k3",
    std_eps: float = 1e-4,
    scale_by_std: bool = True,
    importance_sampling: str | None = None,
    importance_sampling_clip_max: float = 3.0,
    importance_sampling_clip_min: float | None = None,
    off_policy_mask_threshold: float | None = None,
) -> Tensor:
    """GRPO: token-level clipped ratio surrogate with group-normalized advantages.

    Per valid token ``t`` of response ``i`` (advantage ``A_i`` from :func:`grpo_advantages`)::

        rho_t  = exp(token_logp_t - behavior_token_logp_t)
        loss_t = -min(rho_t * A_i, clip(rho_t, 1 - clip_eps, 1 + clip_eps) * A_i)
                 + kl_coef * KL_t

    ``KL_t`` is the ``kl_estimator`` estimate (k1, k2 or k3, see ``_token_kl``) of
    KL(pi_theta || pi_ref) at that token, applied in the loss (not folded into the
    reward). The loss is the mean of ``loss_t`` over all valid tokens of all responses in
    groups with at least 2 responses ("token-level" normalization: long responses weigh
    more, as in DAPO and TRL's default). ``behavior_token_logp=None`` means on-policy
    data: the ratio is 1 with the gradient of the learner's log-prob.

    **Corrections for stale rollouts** (``docs/METHOD.md#corrections-for-stale-rollouts``). ``pi_old`` is the
    learner's log-prob at the start of the update, without gradient: the trainer takes one optimizer step per batch,
    so it is ``token_logp.detach()``. With ``importance_sampling`` (one of :data:`IS_MODES`) the ratio is taken
    against ``pi_old`` instead of ``mu`` (``rho_t = pi_theta / pi_old``: 1 in value, the score in gradient, the clip
    never active) and the surrogate is weighted by :func:`importance_weights` ``w_t`` (``pi_old / mu`` truncated at
    or masked outside ``[importance_sampling_clip_min, importance_sampling_clip_max]``)::

        loss_t = -w_t * min(rho_t * A_i, clip(rho_t, 1 - clip_eps, 1 + clip_eps) * A_i) + kl_coef * KL_t

    With ``off_policy_mask_threshold`` (delta) the surrogate of every response that
    :func:`off_policy_sequence_mask` drops is 0 (its KL penalty stays). Weights and masks leave the denominator (all
    valid tokens) as it is, as TRL does.

    Shapes: ``token_logp``, ``behavior_token_logp``, ``ref_token_logp``: ``[G, K, T]``
    float; ``token_mask``: ``[G, K, T]`` bool; ``rewards``, ``group_mask``: ``[G, K]``.
    """
    group_mask = _checked_grpo_inputs(token_logp, behavior_token_logp, token_mask, rewards, group_mask, clip_eps,
                                      kl_coef, ref_token_logp, kl_estimator)
    problems = correction_errors(importance_sampling, importance_sampling_clip_max, importance_sampling_clip_min,
                                 off_policy_mask_threshold)
    if problems:
        raise ValueError(problems[0])
    check_rewards(rewards, group_mask)

    dtype = compute_dtype(token_logp)
    adv = grpo_advantages(rewards.to(dtype), group_mask, std_eps, scale_by_std).unsqueeze(-1)  # [G, K, 1]
    n = group_mask.sum(dim=-1)  # [G]
    valid = token_mask & (group_mask & (n >= 2).unsqueeze(-1)).unsqueeze(-1)  # [G, K, T]
    zero = torch.zeros((), dtype=dtype, device=token_logp.device)
    lp = torch.where(valid, token_logp.to(dtype), zero)  # [G, K, T]
    behavior = None if behavior_token_logp is None else behavior_token_logp.to(dtype)  # [G, K, T]
    mu = lp.detach() if behavior is None else torch.where(valid, behavior, zero)  # [G, K, T]
    anchor = mu if importance_sampling is None else lp.detach()  # [G, K, T]: mu, or pi_old (decoupled)
    ratio = torch.exp(lp - anchor)  # [G, K, T]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)  # [G, K, T]
    surrogate = corrected_surrogate(surrogate, lp, mu, valid, adv.squeeze(-1), importance_sampling,
                                    importance_sampling_clip_max, importance_sampling_clip_min,
                                    off_policy_mask_threshold)  # [G, K, T]
    per_token = -surrogate
    if kl_coef > 0:
        ref = torch.where(valid, ref_token_logp.to(dtype), zero)
        per_token = per_token + kl_coef * _token_kl(lp, ref, kl_estimator)
    per_token = torch.where(valid, per_token, zero)
    return per_token.sum() / valid.sum().clamp(min=1).to(dtype)


# ----------------------------------------------------------------------------- denominators


def contrasted_groups(mask: Tensor, lengths: Tensor) -> Tensor:
    """The groups with at least 2 valid responses (0-d): what GGPO, AGRO and MaxRL divide their sum over groups by.
    ``mask`` bool ``[G, K]``, ``lengths`` ``[G, K]`` response tokens."""
    return (mask.sum(-1) >= 2).sum()


def contrasted_tokens(mask: Tensor, lengths: Tensor) -> Tensor:
    """The response tokens of those groups' valid responses (0-d): what GRPO divides its sum over tokens by."""
    kept = mask & (mask.sum(-1, keepdim=True) >= 2)  # [G, K]
    return torch.where(kept, lengths, torch.zeros_like(lengths)).sum()


# ----------------------------------------------------------------------------- the objective interface


@dataclass
class ObjectiveConfig:
    """The objective and its settings: the recipe group ``model.objective``."""

    name: str = "ggpo"
    """Registered objective: ``ggpo``, ``agro``, ``grpo``, ``maxrl``, ``prime_rl``, ``m2po``, ``oapl``, ``vespo`` or
    a plugin's (see ``available_objectives``)."""
    beta: float = 0.04
    """KL strength (> 0): GGPO's and AGRO's temperature, GRPO's KL-penalty coefficient, prime-rl's ``kl_tau`` and
    OAPL's ``beta_2`` (both towards the behavior; ``docs/METHOD.md#objectives-that-embrace-lagged-data``)."""
    clip_eps: float = 0.2
    """GRPO's ratio clip, and prime-rl's DPPO mask threshold on ``pi - mu`` (its ``dppo_mask_low`` and
    ``dppo_mask_high``), in (0, 1)."""
    kl_estimator: str = "k3"
    """GRPO's per-token KL estimator in the loss: ``k1``, ``k2`` or ``k3``."""
    importance_sampling: str | None = None
    """GRPO's importance-sampling correction from the behavior to the learner at the start of the update
    (``docs/METHOD.md#corrections-for-stale-rollouts``): ``token_truncate``, ``token_mask``, ``sequence_truncate``,
    ``sequence_mask`` (TRL's ``vllm_importance_sampling_mode``), or null: off, the ratio against the behavior."""
    importance_sampling_clip_max: float = 3.0
    """Upper bound C of the importance weight (> 0): truncated at C or masked above it (TRL's
    ``vllm_importance_sampling_clip_max``, formerly ``vllm_importance_sampling_cap``, default 3.0)."""
    importance_sampling_clip_min: float | None = None
    """Lower bound of the importance weight (below ``importance_sampling_clip_max``), or null: none (TRL's
    ``vllm_importance_sampling_clip_min``). IcePop: ``token_mask`` with bounds 0.5 and 5."""
    off_policy_mask_threshold: float | None = None
    """GRPO's off-policy sequence masking (DeepSeek-V3.2): delta (>= 0) on a negative-advantage response's mean
    per-token KL(mu || pi_old), above which it is dropped; null: off (TRL's ``off_policy_mask_threshold``)."""
    m2_threshold: float | None = None
    """M2PO's ``tau_M2`` (> 0): tokens of largest ``(log pi/mu)^2`` are masked until the rest's mean is below it;
    null: M2PO's default 0.04 (AReaL's ``actor.m2_threshold`` in its M2PO example)."""
    oapl_value_beta: float | None = None
    """OAPL's ``beta_1`` (> 0), the temperature of the group's optimal value ``beta_1 * log mean exp(r / beta_1)``;
    null: OAPL's default 1.0 (the authors' released script)."""
    behavior_anchor: float | None = None
    """Weight lambda of the behavior anchor ``lambda * mean(-log pi(y))`` over the behavior's samples
    (``docs/METHOD.md#the-behavior-anchor``), added to any objective's loss. None = the objective's default:
    ``anchor_when_stale * beta`` when rollouts can be stale (``rollout.sync_every > 1``,
    ``rollout.schedule: async`` with a ``max_staleness`` above 0, or offline data), else 0."""

    def anchor_weight(self, staleness_limit: int | None) -> float:
        """The behavior anchor's lambda for rollouts at most ``staleness_limit`` updates behind the learner
        (:attr:`RolloutConfig.staleness_limit <ggpo_lightning.rollouts.config.RolloutConfig.staleness_limit>`);
        None: no bound (offline data, generated once and replayed)."""
        if self.behavior_anchor is not None:
            return self.behavior_anchor
        stale = staleness_limit is None or staleness_limit > 0
        return get_objective(self.name).anchor_when_stale * self.beta if stale else 0.0

    def errors(self) -> list[str]:
        """Every invalid setting, each naming its recipe key (empty when valid)."""
        errors = []
        if _find_objective(self.name) is None:
            errors.append(f"model.objective.name: unknown objective {self.name!r}; available: "
                          f"{', '.join(available_objectives())} (a plugin's: --objective_module or an entry point "
                          f"of {ENTRY_POINT_GROUP!r}, docs/ADDING_AN_OBJECTIVE.md)")
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta > 0):
            errors.append(f"model.objective.beta must be a finite number > 0, got {self.beta!r}")
        if not 0 < self.clip_eps < 1:
            errors.append(f"model.objective.clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.behavior_anchor is not None and not (math.isfinite(self.behavior_anchor)
                                                     and self.behavior_anchor >= 0):
            errors.append(f"model.objective.behavior_anchor must be >= 0 or null (the objective's default), "
                          f"got {self.behavior_anchor}")
        if self.kl_estimator not in KL_ESTIMATORS:
            errors.append(f"model.objective.kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, "
                          f"got {self.kl_estimator!r}")
        for key in ("m2_threshold", "oapl_value_beta"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                errors.append(f"model.objective.{key} must be a finite number > 0, or null (the objective's "
                              f"default), got {value!r}")
        errors += correction_errors(self.importance_sampling, self.importance_sampling_clip_max,
                                    self.importance_sampling_clip_min, self.off_policy_mask_threshold,
                                    prefix="model.objective.")
        if self.name in _OBJECTIVES:
            takes = _OBJECTIVES[self.name].options
            errors += [f"model.objective.{key} is set but objective {self.name!r} does not take it (taken by: "
                       f"{', '.join(n for n, o in sorted(_OBJECTIVES.items()) if key in o.options) or 'none'}); "
                       "remove it or change model.objective.name"
                       for key in SWITCHED_OPTIONS if getattr(self, key) is not None and key not in takes]
        return errors


@dataclass(frozen=True)
class ObjectiveInputs:
    """One step's prompt groups as every objective sees them (``G`` groups of up to ``K`` responses).

    Sequence-level fields (``ref_logp`` included) are always set; the token-level fields (``T`` = longest response) only for ``level == "token"``
    objectives, ``behavior_token_logp`` only when it ``uses_behavior_logp``.
    """

    logp: Tensor
    """``[G, K]`` learner sequence log-probs (carry the gradient)."""
    rewards: Tensor
    """``[G, K]`` rewards."""
    mask: Tensor
    """``[G, K]`` bool, True where a response is present."""
    ref_logp: Tensor | None = None
    """``[G, K]`` reference sequence log-probs (no gradient)."""
    token_logp: Tensor | None = None
    """``[G, K, T]`` learner token log-probs (carry the gradient)."""
    token_mask: Tensor | None = None
    """``[G, K, T]`` bool, True on response tokens."""
    ref_token_logp: Tensor | None = None
    """``[G, K, T]`` reference token log-probs."""
    behavior_token_logp: Tensor | None = None
    """``[G, K, T]`` behavior token log-probs recorded at rollout time."""
    behavior_logp: Tensor | None = None
    """``[G, K]`` behavior sequence log-probs recorded at rollout time (when every group has them)."""


@dataclass(frozen=True)
class Objective:
    """A registered objective: ``loss(inputs, config)`` and what it needs from a batch.

    ``level`` is ``"sequence"`` (needs only the ``[G, K]`` fields of
    :class:`ObjectiveInputs`) or ``"token"`` (needs the ``[G, K, T]`` fields too).
    ``uses_behavior_logp``: needs the behavior policy's token log-probs (recorded at rollout time) for importance ratios.
    Adding an objective is one :func:`register_objective` call: the trainer never names
    objectives (see ``docs/ADDING_AN_OBJECTIVE.md``).
    """

    name: str
    loss: Callable[[ObjectiveInputs, ObjectiveConfig], Tensor]
    level: str
    uses_behavior_logp: bool = False
    anchor_when_stale: float = 0.0
    """Default behavior-anchor weight, as a multiple of beta, when rollouts can be stale (0 = none)."""
    options: tuple[str, ...] = ()
    """The :data:`SWITCHED_OPTIONS` of ``ObjectiveConfig`` this objective reads (any other one set is an error)."""
    denominator: Callable[[Tensor, Tensor], Tensor] | None = None
    """How the loss normalises, declared: ``denominator(mask, lengths)`` (bool ``[G, K]`` and ``[G, K]`` response
    tokens: known before any forward) is the count the loss divides a sum of per-group terms by, each term a
    function of its own group alone, a group that adds nothing to the count adding nothing to the sum::

        loss(inputs) = sum_g term_g / max(denominator(mask, lengths), 1)

    e.g. :func:`contrasted_groups` (a mean over groups) or :func:`contrasted_tokens` (a mean over the step's
    tokens). Then the loss of some of the step's groups, times their count over the step's, is their exact share
    of the step's loss, and a micro-batched step takes one pass (``docs/METHOD.md#micro-batched-steps``). None
    (undeclared, e.g. a loss with batch-level statistics of the learner's log-probs): two passes, exact for any
    loss."""


_OBJECTIVES: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    """Add ``objective`` to the registry under ``objective.name`` (a name may be registered once)."""
    if objective.level not in ("sequence", "token"):
        raise ValueError(f"Objective.level must be 'sequence' or 'token', got {objective.level!r}")
    if objective.uses_behavior_logp and objective.level != "token":
        raise ValueError(f"objective {objective.name!r}: behavior log-probs are token-level; set level='token'")
    if objective.name in _OBJECTIVES:
        raise ValueError(f"an objective named {objective.name!r} is already registered")
    _OBJECTIVES[objective.name] = objective
    return objective


ENTRY_POINT_GROUP = "ggpo.objectives"
"""The entry-point group of objectives from other packages: ``NAME = "package.module:OBJECTIVE"`` names an
:class:`Objective` (registered when a recipe first names it), or a module that registers ``NAME`` on import."""


def get_objective(name: str) -> Objective:
    """The registered objective called ``name`` (an entry point of :data:`ENTRY_POINT_GROUP` is loaded on first use);
    ValueError listing the known names otherwise."""
    objective = _find_objective(name)
    if objective is None:
        raise ValueError(f"unknown objective {name!r}; available: {', '.join(available_objectives())}")
    return objective


def _find_objective(name: str) -> Objective | None:
    """The objective ``name``: registered, or from its entry point (loaded and registered); None when neither."""
    if name in _OBJECTIVES:
        return _OBJECTIVES[name]
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        return None
    loaded = found[0].load()  # a module registers itself on import; an Objective is registered here
    if isinstance(loaded, Objective):
        if loaded.name != name:
            raise ValueError(f"entry point {name} = {found[0].value} ({ENTRY_POINT_GROUP}) is the objective "
                             f"{loaded.name!r}: the entry point's name must be the objective's")
        register_objective(loaded)
    if name not in _OBJECTIVES:
        raise ValueError(f"entry point {name} = {found[0].value} ({ENTRY_POINT_GROUP}) registered no objective "
                         f"{name!r}: point it at an Objective, or at a module that registers one")
    return _OBJECTIVES[name]


def import_objective_modules(modules: Iterable[str]) -> None:
    """Import each module of ``modules`` (dotted names, ``ggpo-train --objective_module``), whose import registers
    objectives (:func:`register_objective`). A module that is not found is a
    :class:`~ggpo_lightning.records.errors.SettingsError` naming it."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name is None or not (module == error.name or module.startswith(f"{error.name}.")):
                raise  # the module itself was found, something it imports was not: its own traceback
            raise SettingsError(f"objective_module: cannot import {module!r} ({error}); is its folder on "
                                "PYTHONPATH, or its package installed?") from error


def available_objectives() -> list[str]:
    """Sorted names of the registered objectives and of the entry points of :data:`ENTRY_POINT_GROUP`."""
    return sorted(set(_OBJECTIVES) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


register_objective(Objective(
    "ggpo", lambda x, c: ggpo_loss(x.logp, x.ref_logp, x.rewards, c.beta, x.mask), "sequence",
    anchor_when_stale=1.0, denominator=contrasted_groups))  # Gibbs gap (log-mean-exp minus mean) of KL-adjusted rewards; off-policy, no ratios  # docs/METHOD.md#recommended-settings
register_objective(Objective(
    "agro", lambda x, c: agro_loss(x.logp, x.ref_logp, x.rewards, c.beta, x.mask), "sequence",
    denominator=contrasted_groups))
# AGRO: variance of KL-adjusted rewards over 2*beta (GGPO's quadratic approximation)
register_objective(Objective(
    "maxrl", lambda x, c: maxrl_loss(x.logp, x.rewards, x.mask), "sequence",
    denominator=contrasted_groups))
# MaxRL: mean score of successes minus mean score of all (binary rewards)
register_objective(Objective(
    "grpo", lambda x, c: grpo_loss(x.token_logp, x.behavior_token_logp, x.token_mask, x.rewards, x.mask,
                                   clip_eps=c.clip_eps, kl_coef=c.beta, ref_token_logp=x.ref_token_logp,
                                   kl_estimator=c.kl_estimator, importance_sampling=c.importance_sampling,
                                   importance_sampling_clip_max=c.importance_sampling_clip_max,
                                   importance_sampling_clip_min=c.importance_sampling_clip_min,
                                   off_policy_mask_threshold=c.off_policy_mask_threshold),
    "token", uses_behavior_logp=True, options=CORRECTION_OPTIONS,
    denominator=contrasted_tokens))  # token-level clipped ratio surrogate, group-normalized advantages; its
# corrections weigh or mask tokens and responses, never the denominator
