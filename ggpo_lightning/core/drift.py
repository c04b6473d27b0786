"""Staleness: the behavior anchor and drift diagnostics, as pure tensor functions.

GGPO's group loss sees only *differences* of log-probs within a group: adding the
same constant to ``log pi(y_i)`` for every response of a group leaves ``L_K``
unchanged. Between two syncs of a stale rollout model nothing therefore stops the
learner from moving probability mass off the responses the behavior policy sampled
(``docs/METHOD.md#why-ggpo-drifts``). :func:`behavior_anchor` is the term that does,
and :func:`drift_diagnostics` measures how far the learner has moved from the
behavior on the behavior's own samples.

Shapes follow ``objectives.py``: ``G`` prompt groups of up to ``K`` responses, every
tensor ``[G, K]`` of *sequence* log-probabilities (sum of a response's token
log-probs) or rewards, and a bool ``mask`` ``[G, K]`` (True where a response is
present; masked entries never change a value nor receive gradient, NaN included).
Every mean is over groups with at least one valid response of that group's mean, so
each prompt weighs the same whatever its group size (as in ``ggpo_loss``). Nothing
here imports Lightning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from ggpo_lightning.core.objectives import check_groups, check_rewards, compute_dtype

__all__ = ["DriftDiagnostics", "anchored_groups", "behavior_anchor", "coverage_diagnostics", "coverage_rows",
           "drift_diagnostics"]


def _per_group_mean(x: Tensor, mask: Tensor, empty: float) -> Tensor:
    """Mean over groups (with >= 1 valid entry) of the group's masked mean; ``empty`` if none is valid.

    ``x`` is ``[G, K]``; masked entries may hold anything (they are replaced by 0 with
    ``torch.where``, so neither their value nor a NaN gradient leaks).
    """
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    n = mask.sum(dim=-1)  # [G]
    per_group = torch.where(mask, x, zero).sum(dim=-1) / n.clamp(min=1).to(x.dtype)  # [G]
    keep = n > 0  # [G]
    if not bool(keep.any()):
        return per_group.sum() * 0 + empty  # keeps the graph, so a caller's backward still runs
    return torch.where(keep, per_group, zero).sum() / keep.sum().to(x.dtype)


def behavior_anchor(logp: Tensor, mask: Tensor | None = None) -> Tensor:
    """The behavior anchor: mean negative sequence log-prob of the behavior's samples under the learner.

    ::

        anchor = mean over groups g of (1/K_g) * sum_i -log pi_theta(y_gi)        y_gi ~ mu

    The caller adds ``lambda * anchor`` to the objective. In expectation
    ``E_mu[-log pi_theta] = KL(mu || pi_theta) + H(mu)``, and ``H(mu)`` does not depend on
    theta: the term is ``lambda * KL(mu || pi_theta)`` up to a constant, estimated without
    importance weights and without behavior log-probs. Its gradient is
    ``-lambda * mean_i grad log pi_theta(y_i)``, whose expectation
    ``-lambda * E_mu[grad log pi_theta]`` is exactly zero when ``mu = pi_theta`` (on policy)
    and, off policy, pulls mass back onto the behavior's samples
    (``docs/METHOD.md#the-behavior-anchor``).

    Normalisation is per *sequence*, deliberately: GGPO's loss acts on sequence
    log-probs, so both terms multiply the same sequence score ``grad log pi(y)`` and
    ``lambda / beta`` is a length-free trade-off. Dividing each response's ``-log pi`` by
    its own length would make the expected on-policy gradient ``grad E_pi[1/|y|]``,
    not zero: a push towards shorter responses. Dividing by a constant token count is
    only a rescaled ``lambda``. ``lambda = beta`` (the trainer's default for stale GGPO)
    stopped the stale collapse on the quickstart's language model and cost nothing
    measurable near on policy (``docs/METHOD.md#recommended-settings``); offline it moves
    the optimum off ``pi*`` (``docs/METHOD.md#the-fixed-point``).

    Args:
        logp: ``[G, K]`` learner sequence log-probs of the behavior's responses (with gradient).
        mask: optional bool ``[G, K]``, True where a response is present.

    Returns:
        0-d tensor; groups without a valid response are left out (0 if there are none).
    """
    mask = check_groups(mask, logp=logp)
    return _per_group_mean(-logp.to(compute_dtype(logp)), mask, empty=0.0)


def anchored_groups(mask: Tensor) -> Tensor:
    """The groups with at least one valid response (0-d): what :func:`behavior_anchor` divides its sum over groups
    by, known before any forward (its declared denominator, :attr:`~ggpo_lightning.core.objectives.Objective.denominator`)."""
    return mask.any(-1).sum()


@dataclass(frozen=True)
class DriftDiagnostics:
    """How far the learner has moved from the behavior, measured on the behavior's samples.

    Every field is a 0-d tensor in nats (``docs/METHOD.md#diagnostics``); ``r = pi/mu``.
    """

    kl_behavior_k1: Tensor
    """``mean(log mu - log pi)``: unbiased for KL(mu || pi); can be negative on a batch."""
    kl_behavior_k3: Tensor
    """``mean((r - 1) - log r)``: unbiased for KL(mu || pi), never negative, lower variance near 0."""
    logratio_correct: Tensor
    """``mean(log pi - log mu)`` over responses with reward > 0.5; NaN if the batch has none."""
    logratio_wrong: Tensor
    """``mean(log pi - log mu)`` over responses with reward <= 0.5; NaN if the batch has none."""
    log_mass_ratio: Tensor
    """``mean_g [log sum_i pi(y_gi) - log sum_i mu(y_gi)]``: < 0 when mass left the sampled responses."""
    logratio_ref_on_behavior: Tensor
    """``mean(log pi - log pi_ref)`` on mu's samples: KL(mu || pi_ref) - KL(mu || pi), not KL(pi || pi_ref)."""

    def as_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """The fields as ``{prefix + name: value}``, e.g. for ``LightningModule.log_dict``."""
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}


@torch.no_grad()
def drift_diagnostics(
    logp: Tensor, mu_logp: Tensor, ref_logp: Tensor, rewards: Tensor, mask: Tensor | None = None
) -> DriftDiagnostics:
    """Drift of the learner ``pi`` from the behavior ``mu`` on a batch of behavior samples.

    With ``d_i = log pi(y_i) - log mu(y_i)`` (sequence level) and ``r_i = exp(d_i)``:

    - ``kl_behavior_k1 = mean(-d)`` and ``kl_behavior_k3 = mean(r - 1 - d)``: both unbiased
      for ``KL(mu || pi)`` because the samples come from ``mu`` (``E_mu[r] = 1``); k3 is
      non-negative term by term. On long responses ``r`` can overflow to ``inf`` once the
      learner favours a sample by hundreds of nats: then read k1.
    - ``logratio_correct`` / ``logratio_wrong``: ``mean(d)`` over responses with reward
      ``> 0.5`` / ``<= 0.5`` (each a mean over groups having such a response); GGPO raises
      the first and lowers the second, and a drop of *both* is mass leaving the samples.
    - ``log_mass_ratio = mean_g [logsumexp_i log pi(y_gi) - logsumexp_i log mu(y_gi)]``:
      the log of the learner's total probability on the group's sampled responses over
      the behavior's (a response drawn twice counts twice on both sides).
    - ``logratio_ref_on_behavior = mean(log pi - log pi_ref)``. Its expectation is
      ``KL(mu || pi_ref) - KL(mu || pi)``, which is ``KL(pi || pi_ref)`` only on policy and can
      be negative off policy. No estimate of ``KL(pi || pi_ref)`` from ``mu``'s samples exists
      without importance weights ``pi/mu`` (it depends on where ``pi`` puts mass that ``mu``
      never samples), so this is named for what it is.

    Args:
        logp, mu_logp, ref_logp: ``[G, K]`` sequence log-probs of the behavior's responses
            under the learner, the behavior (recorded at rollout time) and the reference.
        rewards: ``[G, K]`` float rewards; mask: optional bool ``[G, K]``.
    """
    mask = check_groups(mask, logp=logp, mu_logp=mu_logp, ref_logp=ref_logp, rewards=rewards)
    check_rewards(rewards, mask)
    dtype = compute_dtype(logp)
    lp, mu, ref = (t.to(dtype) for t in (logp, mu_logp, ref_logp))  # [G, K] each
    d = lp - mu  # [G, K]
    correct = rewards > 0.5  # [G, K]
    neg_inf = torch.full((), -math.inf, dtype=dtype, device=lp.device)
    has_any = mask.any(dim=-1)  # [G]
    mass_pi = torch.logsumexp(torch.where(mask, lp, neg_inf), dim=-1)  # [G], -inf for an empty group
    mass_mu = torch.logsumexp(torch.where(mask, mu, neg_inf), dim=-1)  # [G]
    return DriftDiagnostics(
        kl_behavior_k1=_per_group_mean(-d, mask, math.nan),
        kl_behavior_k3=_per_group_mean(torch.expm1(d) - d, mask, math.nan),
        logratio_correct=_per_group_mean(d, mask & correct, math.nan),
        logratio_wrong=_per_group_mean(d, mask & ~correct, math.nan),
        log_mass_ratio=_per_group_mean((mass_pi - mass_mu).unsqueeze(-1), has_any.unsqueeze(-1), math.nan),
        logratio_ref_on_behavior=_per_group_mean(lp - ref, mask, math.nan),
    )


@torch.no_grad()
def coverage_rows(token_logp: Tensor, behavior_token_logp: Tensor, target_mask: Tensor, valid: Tensor) -> Tensor:
    """Per valid response: ``[log pi(y) - log mu(y), tokens, max_t (log pi(y_t) - log mu(y_t))]``, float64 ``[N, 3]``.

    Args:
        token_logp, behavior_token_logp: ``[B, L]`` learner and behavior token log-probs of the step's responses
            (one row per response; off the responses anything).
        target_mask: ``[B, L]`` bool, True on response tokens.
        valid: ``[B]`` bool, the responses the objective sees (a masked response is left out).

    The rows of several processes concatenate into those of the whole step (:func:`coverage_diagnostics`).
    """
    neg_inf = torch.full((), -math.inf, dtype=torch.float64, device=token_logp.device)
    d = torch.where(target_mask, token_logp.detach().double() - behavior_token_logp.double(), 0.0)  # [B, L]
    rows = torch.stack([d.sum(-1), target_mask.sum(-1).double(),
                        torch.where(target_mask, d, neg_inf).amax(-1)], dim=-1)  # [B, 3]
    return rows[valid]  # [N, 3]


def coverage_diagnostics(rows: Tensor) -> dict[str, Tensor]:
    """Coverage of the learner by the behavior on the step's responses (``docs/METHOD.md#diagnostics``).

    ``rows`` is :func:`coverage_rows` of every response of the step (``[N, 3]``, all processes), with ``log r_i =
    log pi(y_i) - log mu(y_i)`` (sequence level) and ``w_i = r_i = pi(y_i)/mu(y_i)``:

    - ``coverage_log_ratio_max = max_i log r_i`` and ``coverage_log_ratio_p95`` (the 95th percentile of the ``log r_i``,
      linear interpolation between order statistics): both lower bounds on ``log C``, ``C = max_y pi(y)/mu(y)``
      (a max over samples cannot exceed the max over all responses; the percentile is below the max);
    - ``coverage_ess = (sum_i w_i)^2 / sum_i w_i^2``, in log space with the shift ``m = max_i log r_i``
      (``w_i e^-m <= 1``: no overflow at hundreds of nats), and ``coverage_ess_share = ESS / N`` (1 on policy,
      ``1/N`` when one response carries all the weight);
    - ``token_log_ratio_mean = sum_i log r_i / sum_i |y_i|`` (the mean per-token log-ratio over every response token)
      and ``token_log_ratio_max``, its max over tokens.

    The mean of ``log r`` is ``-kl_behavior_k1``'s (up to its per-group weighting): not repeated. Empty ``rows``: {}.
    """
    if rows.shape[0] == 0:
        return {}
    log_r, tokens, token_max = rows.unbind(-1)  # [N] each
    w = torch.exp(log_r - log_r.max())  # [N], <= 1
    ess = w.sum() ** 2 / (w * w).sum()
    return {
        "coverage_log_ratio_max": log_r.max(),
        "coverage_log_ratio_p95": torch.quantile(log_r, 0.95),
        "coverage_ess": ess,
        "coverage_ess_share": ess / log_r.numel(),
        "token_log_ratio_mean": log_r.sum() / tokens.sum().clamp(min=1),
        "token_log_ratio_max": token_max.max(),
    }
