"""The exact finite-action lab: GGPO's theory made checkable.

A "policy" here is a softmax over ``A`` actions (one action = one whole response), so
every quantity of ``docs/METHOD.md`` (``#the-objective``,
``#why-it-is-safe-off-policy-the-bound-and-coverage``) is computable exactly, in float64:

- the Gibbs policy ``pi*(y) ∝ pi_ref(y) exp(r(y)/beta)`` and its value
  ``J* = beta * log E_{pi_ref}[exp(r/beta)]``;
- ``J(pi) = E_pi[r] - beta * KL(pi || pi_ref)``;
- the coverage factor ``C = max_y pi(y) / mu(y)``;
- the population loss ``L = beta * log E_mu[exp(r~/beta)] - E_mu[r~]`` with
  ``r~ = r - beta * (log pi - log pi_ref)``;

and the guarantee ``J* - J(pi) <= C * L`` (equality when ``mu = pi``) can be tested
on as many random problems as one likes. :func:`train_tabular` fits a policy with any
registered objective from samples of a behavior policy ``mu``: fresh samples of the
current policy (``online``), of a snapshot refreshed every ``sync_every`` steps
(``stale``), or one fixed sample of a given ``mu`` (``offline``).

A problem has ``P`` prompts (``[P, A]`` tensors; a 1-d problem is one prompt). The
policy is either ``tabular`` (free logits per prompt and action) or ``lowrank``:
``logits[p, a] = log pi_ref[p, a] + U[p] . V[a]`` with rank-``r`` factors shared by all
prompts, so an update on one prompt moves the others, as in a language model
(:func:`lowrank_problem` builds a matching problem). Options applied on top of any
objective: the behavior anchor ``lambda * mean(-log pi(y_i))``
(:func:`ggpo_lightning.core.drift.behavior_anchor`) and a log-ratio bound that stops the
gradient of a sample once ``|log pi(y) - log mu(y)|`` passes it. The stale collapse of
GGPO and its fix reproduce in seconds (``docs/METHOD.md#lab-evidence``)::

    ggpo tabular --policy lowrank --prompts 64 --actions 50 --mode stale --sync-every 32 \
        --objectives ggpo,grpo --beta 0.1 --lr 0.2 --steps 640 --anchor 0,0.04

Besides the registered objectives the lab knows ``naive_pg``, the standard
"KL-regularized policy gradient" that fails off-policy: the score-function gradient of
the raw reward on mu's samples with a group-mean baseline and no importance weights,
plus the exact ``KL(pi || pi_ref)`` as a loss term.

The finite-group result (``docs/METHOD.md#the-finite-group-result``) is checked exactly, over every K-tuple of a
small problem (:func:`finite_group_check`, ``ggpo tabular --check finite-group``).

Run it as ``ggpo tabular`` (see ``ggpo tabular --help``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from ggpo_lightning.records.atomic import atomic_write_bytes
from ggpo_lightning.records.extras import require
from ggpo_lightning.core.drift import behavior_anchor
from ggpo_lightning.core.objectives import ObjectiveConfig, ObjectiveInputs, available_objectives, get_objective

MODES = ("offline", "online", "stale")
POLICIES = ("tabular", "lowrank")
LAB_ONLY_OBJECTIVES = ("naive_pg",)


# ----------------------------------------------------------------------------- exact quantities


@dataclass(frozen=True)
class FiniteProblem:
    """A finite-action KL-regularized bandit: float64 tensors ``[A]`` (one prompt) or ``[P, A]``."""

    rewards: Tensor
    ref_logp: Tensor
    mu_logp: Tensor
    beta: float

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        shapes = {t.shape for t in (self.rewards, self.ref_logp, self.mu_logp)}
        if len(shapes) != 1 or self.rewards.dim() not in (1, 2):
            raise ValueError("rewards, ref_logp and mu_logp must be tensors of one shape, [A] or [P, A]; got "
                             f"{[tuple(t.shape) for t in (self.rewards, self.ref_logp, self.mu_logp)]}")

    @property
    def num_actions(self) -> int:
        return self.rewards.shape[-1]

    @property
    def num_prompts(self) -> int:
        return 1 if self.rewards.dim() == 1 else self.rewards.shape[0]


def gibbs_logp(ref_logp: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """``log pi*`` with ``pi*(y) ∝ pi_ref(y) * exp(r(y) / beta)``."""
    return torch.log_softmax(ref_logp + rewards / beta, dim=-1)


def optimal_value(ref_logp: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """``J* = beta * log E_{pi_ref}[exp(r / beta)]``."""
    return beta * torch.logsumexp(ref_logp + rewards / beta, dim=-1)


def value(logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """``J(pi) = E_pi[r] - beta * KL(pi || pi_ref)``."""
    return (logp.exp() * (rewards - beta * (logp - ref_logp))).sum(-1)


def kl_divergence(logp: Tensor, logq: Tensor) -> Tensor:
    """``KL(p || q) = sum_y p(y) (log p(y) - log q(y))``."""
    return (logp.exp() * (logp - logq)).sum(-1)


def coverage(logp: Tensor, mu_logp: Tensor) -> Tensor:
    """``C = max_y pi(y) / mu(y)``."""
    return (logp - mu_logp).max(-1).values.exp()


def population_loss(logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float, mu_logp: Tensor) -> Tensor:
    """``L = beta * log E_mu[exp(r~/beta)] - E_mu[r~]`` with ``r~ = r - beta (log pi - log pi_ref)``."""
    adjusted = rewards - beta * (logp - ref_logp)
    return beta * torch.logsumexp(mu_logp + adjusted / beta, dim=-1) - (mu_logp.exp() * adjusted).sum(-1)


def random_problem(
    num_actions: int, beta: float, generator: torch.Generator, binary_rewards: bool = True
) -> FiniteProblem:
    """A random problem: reference and behavior drawn independently (so ``mu != pi_ref``).

    Binary rewards always contain at least one 0 and one 1 (otherwise ``pi* = pi_ref``).
    """
    if num_actions < 2:
        raise ValueError(f"num_actions must be >= 2, got {num_actions}")

    def random_logp() -> Tensor:
        return torch.log_softmax(torch.randn(num_actions, generator=generator, dtype=torch.float64), -1)

    if binary_rewards:
        rewards = (torch.rand(num_actions, generator=generator, dtype=torch.float64) < 0.5).double()
        rewards[0], rewards[1] = 1.0, 0.0
    else:
        rewards = torch.rand(num_actions, generator=generator, dtype=torch.float64)
    return FiniteProblem(rewards=rewards, ref_logp=random_logp(), mu_logp=random_logp(), beta=beta)


def lowrank_problem(
    num_prompts: int, num_actions: int, beta: float, generator: torch.Generator, rank: int = 4,
    correct_per_prompt: int | None = None, noise: float = 2.0,
) -> FiniteProblem:
    """Many prompts whose correct answers share structure, for the shared-parameter policy.

    Prompt ``p`` and answer ``a`` have latent vectors ``z_p, w_a ~ N(0, I_rank)``; the
    ``correct_per_prompt`` answers (default ``A // 10``, at least 1) with the largest
    ``z_p . w_a + noise * eps_pa`` (``eps ~ N(0, 1)``) are correct (reward 1), the rest
    wrong: the shared features explain correctness only in part, so a rank-``rank``
    policy cannot fit every prompt at once. The reference has random logits
    ``N(0, 1)`` (its success rate is about ``correct_per_prompt / A``) and is also the
    behavior of offline data (``mu = pi_ref``: rollouts of the initial model).
    """
    if num_prompts < 1 or num_actions < 2 or rank < 1:
        raise ValueError(f"need num_prompts >= 1, num_actions >= 2, rank >= 1; got num_prompts={num_prompts}, "
                         f"num_actions={num_actions}, rank={rank}")
    m = correct_per_prompt if correct_per_prompt is not None else max(1, num_actions // 10)
    if not 1 <= m < num_actions:
        raise ValueError(f"correct_per_prompt must be in [1, num_actions), got {m}")
    z = torch.randn(num_prompts, rank, generator=generator, dtype=torch.float64)  # [P, r]
    w = torch.randn(num_actions, rank, generator=generator, dtype=torch.float64)  # [A, r]
    score = z @ w.T + noise * torch.randn(num_prompts, num_actions, generator=generator, dtype=torch.float64)  # [P, A]
    top = score.topk(m, dim=-1).indices  # [P, m]
    rewards = torch.zeros(num_prompts, num_actions, dtype=torch.float64).scatter_(-1, top, 1.0)  # [P, A]
    ref = torch.log_softmax(torch.randn(num_prompts, num_actions, generator=generator, dtype=torch.float64), -1)
    return FiniteProblem(rewards=rewards, ref_logp=ref, mu_logp=ref, beta=beta)


def anchored_optimum(mu_logp: Tensor, target_logp: Tensor, beta: float, anchor: float) -> Tensor:
    """``log q`` for the minimiser ``q`` of ``L(pi) + anchor * KL(mu || pi)`` over all policies (last dim).

    ``L`` is the population GGPO loss on ``mu`` and ``target_logp`` the Gibbs policy
    ``pi*``. Stationarity on the simplex (``docs/METHOD.md#the-fixed-point``) gives, per
    action, with ``rho = anchor / beta`` and ``S = E_mu[pi*/q]``::

        rho * q^2 + (1 - rho) * mu * q - mu * pi* / S = 0

    the positive root, with ``S`` set by ``sum q = 1`` (found by bisection on ``log S``;
    the sum decreases in ``S``). ``anchor = 0`` gives ``pi*``, ``anchor = beta`` the
    geometric mean ``q ∝ sqrt(mu * pi*)``, ``anchor -> inf`` gives ``mu``.
    """
    if anchor < 0:
        raise ValueError(f"anchor must be >= 0, got {anchor}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if anchor == 0:
        return target_logp.clone()
    rho = anchor / beta
    mu, star = mu_logp.exp(), target_logp.exp()  # [..., A]

    def q_of(log_s: Tensor) -> Tensor:
        b = (1 - rho) * mu  # [..., A]
        c = mu * star * torch.exp(-log_s).unsqueeze(-1)  # [..., A]
        root = torch.sqrt(b * b + 4 * rho * c)  # [..., A]
        # the positive root, in whichever of its two forms adds numbers of one sign (no cancellation)
        return torch.where(b >= 0, 2 * c / (b + root), (root - b) / (2 * rho))

    lo = torch.full(mu.shape[:-1], -60.0, dtype=mu.dtype)  # sum q > 1 here
    hi = torch.full(mu.shape[:-1], 60.0, dtype=mu.dtype)  # sum q < 1 here
    for _ in range(200):
        mid = (lo + hi) / 2
        above = q_of(mid).sum(-1) > 1
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return torch.log_softmax(q_of((lo + hi) / 2).log(), -1)


# ----------------------------------------------------------------------------- the finite-group result


def group_expectations(logp: Tensor, ref_logp: Tensor, rewards: Tensor, beta: float, mu_logp: Tensor,
                       k: int) -> tuple[Tensor, Tensor]:
    """``E_{mu^K}[L_K]`` and ``E_{mu^K}[max_i a(y_i)]`` for one prompt (``[A]`` tensors), exactly: a sum over every
    K-tuple of the actions ``mu`` reaches (``mu_logp > -inf``), each weighted by ``prod_i mu(y_i)``. ``A^K`` tuples:
    for small problems (``docs/METHOD.md#the-finite-group-result``)."""
    adjusted = rewards - beta * (logp - ref_logp)  # [A]
    support = torch.nonzero(mu_logp > -math.inf).flatten()  # [S]
    tuples = torch.cartesian_prod(*[support] * k).reshape(-1, k)  # [S^K, K]
    weight = mu_logp[tuples].sum(-1).exp()  # [S^K]
    a = adjusted[tuples]  # [S^K, K]
    group_loss = beta * (torch.logsumexp(a / beta, -1) - math.log(k)) - a.mean(-1)  # [S^K]
    return (weight * group_loss).sum(), (weight * a.max(-1).values).sum()


@dataclass(frozen=True)
class FiniteGroupCheck:
    """The finite-group result on one problem and ``K`` (``docs/METHOD.md#the-finite-group-result``), every value
    exact. ``a = r - beta (log pi - log pi_ref)``; expectations of tuples are over ``y_1..y_K ~ mu`` independently."""

    k: int
    coverage: float
    """``C = max_y pi(y)/mu(y)`` (inf when ``mu`` misses an action)."""
    coverage_on_support: float
    """The same max over the actions ``mu`` reaches only: what a check blind to the missed actions would use."""
    gap: float
    """``J* - J(pi)``."""
    group_loss: float
    """``E[L_K]``."""
    best_of_k: float
    """``E[max_i a(y_i)]``: the behavior's best-of-K in adjusted reward."""
    behavior_mean: float
    """``E_mu[a]``: one behavior response."""
    learner_value: float
    """``J(pi) = E_pi[a]``: one learner response."""
    shortfall: float
    """``Delta_K = max_{y: mu(y) > 0} a(y) - E[max_i a(y_i)]``: how far the best-of-K falls short of the best."""
    beta: float

    @property
    def slack(self) -> float:
        """``E[L_K] + beta log K + Delta_K``: an upper bound on the population loss ``L``."""
        return self.group_loss + self.beta * math.log(self.k) + self.shortfall

    @property
    def bound(self) -> float:
        """``C * (E[L_K] + beta log K + Delta_K)``: the theorem's bound on ``J* - J(pi)``."""
        return self.coverage * self.slack if self.slack > 0 else 0.0

    def holds(self, tol: float = 1e-9) -> bool:
        """The theorem: ``J* - J(pi) <= C (E[L_K] + beta log K + Delta_K)``."""
        return self.gap <= self.bound + tol * (1 + abs(self.bound))

    def holds_on_support(self, tol: float = 1e-9) -> bool:
        """The same with ``C`` taken over ``mu``'s support only: fails where coverage does."""
        return self.gap <= self.coverage_on_support * max(self.slack, 0.0) + tol * (1 + abs(self.gap))

    def sandwich_holds(self, tol: float = 1e-9) -> bool:
        """``E[max a] - E_mu[a] - beta log K <= E[L_K] <= E[max a] - E_mu[a]`` (no coverage needed)."""
        spread = self.best_of_k - self.behavior_mean
        return spread - self.beta * math.log(self.k) - tol <= self.group_loss <= spread + tol

    def learner_form_holds(self, tol: float = 1e-9) -> bool:
        """The conjecture ``E[max_i a(y_i)] - J(pi) <= C (E[L_K] + beta log K)`` (best-of-K of the behavior against
        one learner response): not a theorem, false in general (``K = 1``, ``mu = pi* != pi``); checked to show
        where."""
        slack = self.group_loss + self.beta * math.log(self.k)
        return self.best_of_k - self.learner_value <= (self.coverage * slack if slack > 0 else 0.0) + tol


def finite_group_check(problem: FiniteProblem, logp: Tensor, k: int) -> FiniteGroupCheck:
    """:class:`FiniteGroupCheck` of the policy ``logp`` (``[A]``) on a one-prompt ``problem`` for groups of ``k``."""
    if problem.num_prompts != 1:
        raise ValueError("the finite-group check takes a one-prompt problem")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    r, ref, mu, beta = problem.rewards, problem.ref_logp, problem.mu_logp, problem.beta
    group_loss, best_of_k = group_expectations(logp, ref, r, beta, mu, k)
    adjusted = r - beta * (logp - ref)  # [A]
    reached = mu > -math.inf  # [A]
    return FiniteGroupCheck(
        k=k, beta=beta,
        coverage=coverage(logp, mu).item(),
        coverage_on_support=(logp - mu)[reached].max().exp().item(),
        gap=(optimal_value(ref, r, beta) - value(logp, ref, r, beta)).item(),
        group_loss=group_loss.item(),
        best_of_k=best_of_k.item(),
        behavior_mean=(mu.exp() * adjusted)[reached].sum().item(),
        learner_value=value(logp, ref, r, beta).item(),
        shortfall=(adjusted[reached].max() - best_of_k).item(),
    )


def finite_group_checks(num_actions: int, beta: float, ks: list[int], problems: int,
                        generator: torch.Generator) -> list[tuple[str, FiniteGroupCheck]]:
    """``problems`` random problems (:func:`random_problem`, a random policy ``pi``) checked for every ``k`` of
    ``ks``, each in three cases: ``covered`` (``mu`` as drawn, every action reached), ``on-policy`` (``mu = pi``),
    ``uncovered`` (``mu`` with half of the actions, the learner's most likely first, removed: ``C = inf``)."""
    rows = []
    for _ in range(problems):
        p = random_problem(num_actions, beta, generator)
        logp = torch.log_softmax(2 * torch.randn(num_actions, generator=generator, dtype=torch.float64), -1)
        missed = logp.argsort(descending=True)[: num_actions // 2]
        cut = p.mu_logp.index_fill(0, missed, -math.inf)
        cases = {"covered": p, "on-policy": replace(p, mu_logp=logp),
                 "uncovered": replace(p, mu_logp=torch.log_softmax(cut, -1))}
        rows += [(case, finite_group_check(q, logp, k)) for k in ks for case, q in cases.items()]
    return rows


# ----------------------------------------------------------------------------- training


@dataclass
class TabularRun:
    """History of one training run, each quantity exact and averaged over prompts.

    Per logged step: ``KL(pi || pi*)``, ``J* - J(pi)``, the mean reward ``E_pi[r]`` and
    ``KL(mu || pi)`` to the current behavior. ``window_drift``: ``KL(mu || pi)`` at the end
    of each sync window, just before the behavior is refreshed (stale and online modes).
    """

    objective: str
    steps: list[int] = field(default_factory=list)
    kl_to_optimum: list[float] = field(default_factory=list)
    suboptimality: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    behavior_kl: list[float] = field(default_factory=list)
    window_drift: list[float] = field(default_factory=list)
    final_logp: Tensor | None = None


class _Policy(torch.nn.Module):
    """``tabular``: free logits ``[P, A]``; ``lowrank``: ``log pi_ref + U @ V.T``, shared by all prompts.

    Both start at ``pi_ref``. ``U`` (prompt features) starts random and ``V`` (answer
    embeddings, shared) at 0, so the first update of ``V`` already moves every prompt.
    """

    def __init__(self, ref_logp: Tensor, kind: str, rank: int, generator: torch.Generator) -> None:
        super().__init__()
        self.register_buffer("ref_logp", ref_logp)
        if kind == "tabular":
            self.logits = torch.nn.Parameter(ref_logp.clone())  # [P, A]
        else:
            num_prompts, num_actions = ref_logp.shape
            u = torch.randn(num_prompts, rank, generator=generator, dtype=ref_logp.dtype)  # [P, r]
            self.u = torch.nn.Parameter(u)
            self.v = torch.nn.Parameter(torch.zeros(num_actions, rank, dtype=ref_logp.dtype))  # [A, r]

    def forward(self) -> Tensor:
        logits = self.logits if hasattr(self, "logits") else self.ref_logp + self.u @ self.v.T  # [P, A]
        return torch.log_softmax(logits, -1)


def _tabular_loss(objective: str, logp: Tensor, logp_all: Tensor, behavior_logp: Tensor, ref_all: Tensor,
                  ref: Tensor, r: Tensor, beta: float) -> Tensor:
    """Loss of ``objective`` on sampled responses: learner, behavior, reference log-probs and rewards ``[G, K]``.

    ``logp_all`` and ``ref_all`` ``[P, A]`` are the whole learner and reference (naive_pg
    uses their exact KL, averaged over prompts).
    """
    if objective == "naive_pg":
        advantage = r - r.mean(-1, keepdim=True)  # [G, K]
        return -(advantage * logp).mean() + beta * kl_divergence(logp_all, ref_all).mean()
    spec = get_objective(objective)
    mask = torch.ones_like(logp, dtype=torch.bool)  # [G, K]
    inputs = ObjectiveInputs(logp=logp, rewards=r, mask=mask, ref_logp=ref, behavior_logp=behavior_logp)
    if spec.level == "token":  # one action = one token
        inputs = replace(inputs, token_logp=logp[..., None], token_mask=mask[..., None],  # [G, K, 1]
                         ref_token_logp=ref[..., None], behavior_token_logp=behavior_logp[..., None])
    return spec.loss(inputs, ObjectiveConfig(objective, beta=beta))


def train_tabular(
    problem: FiniteProblem,
    objective: str,
    mode: str = "offline",
    steps: int = 1500,
    groups: int = 512,
    k: int = 8,
    lr: float = 0.05,
    sync_every: int = 8,
    log_every: int = 50,
    seed: int = 0,
    policy: str = "tabular",
    rank: int = 4,
    anchor: float = 0.0,
    logratio_bound: float | None = None,
) -> TabularRun:
    """Fit a policy (initialized at ``pi_ref``) with Adam, full batch, float64.

    ``mode``: ``offline`` draws ``groups x k`` responses from ``problem.mu_logp`` once;
    ``online`` draws fresh responses from the current policy every step; ``stale`` draws
    fresh responses every step from a snapshot of the policy refreshed every
    ``sync_every`` steps. Group ``g`` belongs to prompt ``g % P``.

    ``policy``: ``tabular`` or ``lowrank`` (rank ``rank``, see :class:`_Policy`).
    ``anchor``: ``lambda >= 0`` of the behavior anchor added to the objective's loss.
    ``logratio_bound``: if set (> 0), a sample with ``|log pi(y) - log mu(y)| >`` the bound
    gets no gradient from the objective (its value still counts).
    """
    _check_train_args(problem, objective, mode, steps, groups, k, sync_every, policy, rank, anchor, logratio_bound)
    gen = torch.Generator().manual_seed(seed)
    ref_logp, rewards, mu_logp = (t.reshape(problem.num_prompts, -1) for t in
                                  (problem.ref_logp, problem.rewards, problem.mu_logp))  # [P, A] each
    learner = _Policy(ref_logp, policy, rank, gen)
    opt = torch.optim.Adam(learner.parameters(), lr=lr)
    target = gibbs_logp(ref_logp, rewards, problem.beta)  # [P, A]
    j_star = optimal_value(ref_logp, rewards, problem.beta)  # [P]
    prompts = torch.arange(groups) % problem.num_prompts  # [G]

    def draw(logp: Tensor) -> Tensor:  # [P, A] -> actions [G, K]
        return torch.multinomial(logp[prompts].exp(), k, replacement=True, generator=gen)

    behavior = mu_logp
    actions = draw(behavior)
    run = TabularRun(objective)
    for step in range(steps + 1):
        with torch.no_grad():
            logp_all = learner()  # [P, A]
        if step % log_every == 0 or step == steps:
            run.steps.append(step)
            run.kl_to_optimum.append(kl_divergence(logp_all, target).mean().item())
            run.suboptimality.append((j_star - value(logp_all, ref_logp, rewards, problem.beta)).mean().item())
            run.reward.append((logp_all.exp() * rewards).sum(-1).mean().item())
            run.behavior_kl.append(kl_divergence(behavior, logp_all).mean().item())
        if step == steps:
            break
        if mode == "online" or (mode == "stale" and step % sync_every == 0):
            if step > 0:
                run.window_drift.append(kl_divergence(behavior, logp_all).mean().item())
            behavior = logp_all
        if mode != "offline":
            actions = draw(behavior)
        loss = _step_loss(objective, learner(), actions, prompts, behavior, ref_logp, rewards, problem.beta,
                          anchor, logratio_bound)
        opt.zero_grad()
        loss.backward()
        opt.step()
    run.final_logp = logp_all.reshape(problem.rewards.shape)
    return run


def _check_train_args(problem: FiniteProblem, objective: str, mode: str, steps: int, groups: int, k: int,
                      sync_every: int, policy: str, rank: int, anchor: float, logratio_bound: float | None) -> None:
    """Raise one ValueError listing every bad argument of :func:`train_tabular`, each by name."""
    known = available_objectives() + list(LAB_ONLY_OBJECTIVES)
    problems = []
    if objective not in known:
        problems.append(f"unknown objective {objective!r}; available: {', '.join(known)}")
    if mode not in MODES:
        problems.append(f"mode must be one of {MODES}, got {mode!r}")
    if policy not in POLICIES:
        problems.append(f"policy must be one of {POLICIES}, got {policy!r}")
    if policy == "lowrank" and rank < 1:
        problems.append(f"rank must be >= 1, got {rank}")
    if k < 2 or steps < 0 or sync_every < 1:
        problems.append(f"need k >= 2, steps >= 0, sync_every >= 1; got k={k}, steps={steps}, sync_every={sync_every}")
    if groups < problem.num_prompts:
        problems.append(f"groups must be >= the number of prompts ({problem.num_prompts}) so that every prompt "
                        f"gets a group, got {groups}")
    if not (math.isfinite(anchor) and anchor >= 0):
        problems.append(f"anchor (lambda) must be a finite number >= 0, got {anchor}")
    if logratio_bound is not None and not logratio_bound > 0:
        problems.append(f"logratio_bound must be > 0 (or None for no bound), got {logratio_bound}")
    if problems:
        raise ValueError("; ".join(problems))


def _step_loss(objective: str, logp_all: Tensor, actions: Tensor, prompts: Tensor, behavior: Tensor,
               ref_logp: Tensor, rewards: Tensor, beta: float, anchor: float, logratio_bound: float | None) -> Tensor:
    """The objective's loss on ``actions`` ``[G, K]``, plus the anchor, with the log-ratio bound applied."""
    rows = prompts.unsqueeze(-1)  # [G, 1]
    logp, mu = logp_all[rows, actions], behavior[rows, actions]  # [G, K]
    bounded = logp
    if logratio_bound is not None:  # stop the gradient of samples too far from the behavior
        bounded = torch.where((logp - mu).abs() > logratio_bound, logp.detach(), logp)  # [G, K]
    loss = _tabular_loss(objective, bounded, logp_all, mu, ref_logp, ref_logp[rows, actions], rewards[rows, actions],
                         beta)
    return loss + anchor * behavior_anchor(logp) if anchor > 0 else loss


def plot_runs(runs: list[TabularRun], path: str, title: str) -> None:
    """Save a PNG with KL(pi || pi*) (log scale) and J* - J against steps, one line per objective."""
    require("matplotlib", "--plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_kl, ax_gap) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        ax_kl.plot(run.steps, [max(v, 1e-18) for v in run.kl_to_optimum], label=run.objective)
        ax_gap.plot(run.steps, run.suboptimality, label=run.objective)
    ax_kl.set(yscale="log", xlabel="optimizer step", ylabel="KL(pi || pi*)")
    ax_gap.set(xlabel="optimizer step", ylabel="J* - J(pi)")
    for ax in (ax_kl, ax_gap):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())  # an interrupted run leaves no half-written PNG
