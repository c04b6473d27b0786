"""The exact finite-action lab: GGPO's theory made checkable.

A "policy" here is a softmax over ``A`` actions (one action = one whole response), so
every quantity of GGPO.md section 3 is computable exactly, in float64:

- the Gibbs policy ``pi*(y) ∝ pi_ref(y) exp(r(y)/beta)`` and its value
  ``J* = beta * log E_{pi_ref}[exp(r/beta)]``;
- ``J(pi) = E_pi[r] - beta * KL(pi || pi_ref)``;
- the coverage factor ``C = max_y pi(y) / mu(y)``;
- the population loss ``L = beta * log E_mu[exp(r~/beta)] - E_mu[r~]`` with
  ``r~ = r - beta * (log pi - log pi_ref)``;

and the guarantee ``J* - J(pi) <= C * L`` (equality when ``mu = pi``) can be tested
on as many random problems as one likes. :func:`train_tabular` fits a tabular policy
with any registered objective from samples of a behavior policy ``mu``: fresh samples
of the current policy (``online``), of a snapshot refreshed every ``sync_every`` steps
(``stale``), or one fixed sample of a given ``mu`` (``offline``).

Besides the registered objectives the lab knows ``naive_pg``, the standard
"KL-regularized policy gradient" that fails off-policy: the score-function gradient of
the raw reward on mu's samples with a group-mean baseline and no importance weights,
plus the exact ``KL(pi || pi_ref)`` as a loss term.

Run it as ``ggpo tabular`` (see ``ggpo tabular --help``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from ggpo_lightning.atomic import atomic_write_bytes
from ggpo_lightning.objectives import ObjectiveConfig, ObjectiveInputs, available_objectives, get_objective

MODES = ("offline", "online", "stale")
LAB_ONLY_OBJECTIVES = ("naive_pg",)


# ----------------------------------------------------------------------------- exact quantities


@dataclass(frozen=True)
class FiniteProblem:
    """A finite-action KL-regularized bandit. Log-probabilities are ``[A]`` float64 tensors."""

    rewards: Tensor
    ref_logp: Tensor
    mu_logp: Tensor
    beta: float

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        shapes = {t.shape for t in (self.rewards, self.ref_logp, self.mu_logp)}
        if len(shapes) != 1 or self.rewards.dim() != 1:
            raise ValueError("rewards, ref_logp and mu_logp must be 1-d tensors of the same length A")

    @property
    def num_actions(self) -> int:
        return self.rewards.numel()


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


# ----------------------------------------------------------------------------- training


@dataclass
class TabularRun:
    """History of one training run: per logged step, KL(pi || pi*) and J* - J(pi)."""

    objective: str
    steps: list[int] = field(default_factory=list)
    kl_to_optimum: list[float] = field(default_factory=list)
    suboptimality: list[float] = field(default_factory=list)
    final_logp: Tensor | None = None


def _tabular_loss(objective: str, logits: Tensor, actions: Tensor, behavior_logp: Tensor,
                  problem: FiniteProblem) -> Tensor:
    """Loss of ``objective`` on sampled ``actions`` ``[G, K]`` for the softmax policy ``logits``."""
    logp_all = torch.log_softmax(logits, -1)  # [A]
    logp, ref, r = logp_all[actions], problem.ref_logp[actions], problem.rewards[actions]  # [G, K]
    beta = problem.beta
    if objective == "naive_pg":
        advantage = r - r.mean(-1, keepdim=True)  # [G, K]
        return -(advantage * logp).mean() + beta * kl_divergence(logp_all, problem.ref_logp)
    spec = get_objective(objective)
    mask = torch.ones_like(actions, dtype=torch.bool)  # [G, K]
    inputs = ObjectiveInputs(logp=logp, rewards=r, mask=mask, ref_logp=ref)
    if spec.level == "token":  # one action = one token
        inputs = replace(inputs, token_logp=logp[..., None], token_mask=mask[..., None],  # [G, K, 1]
                         ref_token_logp=ref[..., None], behavior_token_logp=behavior_logp[actions][..., None])
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
) -> TabularRun:
    """Fit a softmax policy (initialized at ``pi_ref``) with Adam, full batch, float64.

    ``mode``: ``offline`` draws ``groups x k`` actions from ``problem.mu_logp`` once;
    ``online`` draws fresh actions from the current policy every step; ``stale`` draws
    fresh actions every step from a snapshot of the policy refreshed every
    ``sync_every`` steps.
    """
    known = available_objectives() + list(LAB_ONLY_OBJECTIVES)
    if objective not in known:
        raise ValueError(f"unknown objective {objective!r}; available: {', '.join(known)}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if k < 2 or groups < 1 or steps < 0 or sync_every < 1:
        raise ValueError(f"need k >= 2, groups >= 1, steps >= 0, sync_every >= 1; got k={k}, "
                         f"groups={groups}, steps={steps}, sync_every={sync_every}")
    gen = torch.Generator().manual_seed(seed)
    logits = problem.ref_logp.clone().requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=lr)
    target = gibbs_logp(problem.ref_logp, problem.rewards, problem.beta)
    j_star = optimal_value(problem.ref_logp, problem.rewards, problem.beta)
    behavior = problem.mu_logp

    def draw(logp: Tensor) -> Tensor:
        return torch.multinomial(logp.exp(), groups * k, replacement=True, generator=gen).view(groups, k)

    actions = draw(behavior)
    run = TabularRun(objective)
    for step in range(steps + 1):
        logp = torch.log_softmax(logits.detach(), -1)
        if step % log_every == 0 or step == steps:
            run.steps.append(step)
            run.kl_to_optimum.append(kl_divergence(logp, target).item())
            run.suboptimality.append((j_star - value(logp, problem.ref_logp, problem.rewards, problem.beta)).item())
        if step == steps:
            break
        if mode == "online" or (mode == "stale" and step % sync_every == 0):
            behavior = logp
        if mode != "offline":
            actions = draw(behavior)
        loss = _tabular_loss(objective, logits, actions, behavior, problem)
        opt.zero_grad()
        loss.backward()
        opt.step()
    run.final_logp = torch.log_softmax(logits.detach(), -1)
    return run


def plot_runs(runs: list[TabularRun], path: str, title: str) -> None:
    """Save a PNG with KL(pi || pi*) (log scale) and J* - J against steps, one line per objective."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # optional extra
        raise RuntimeError("plotting needs matplotlib: pip install 'ggpo-lightning[plot]'") from exc
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
