"""The staleness comparison of docs/METHOD.md#lab-evidence, on the shared-parameter tabular lab.

GGPO with behavior-anchor lambda in {0, 0.01, 0.04, 0.1}, GGPO at a larger beta, GGPO
with a log-ratio bound, and GRPO, each at sync 1 / 8 / 32 and offline (mu = pi_ref),
over seeds 0, 1, 2 (problem, initialization and sampling seed). Prints markdown tables
of final mean reward, KL(pi || pi*) and drift KL(mu || pi) at window ends (mean over
windows; offline: KL(mu || pi) at the end), as mean ± sample std over seeds. Then the
offline fixed point against lambda on the one-prompt tabular problem (6 actions,
beta 0.5, mu != pi_ref): the exact minimiser q of L + lambda * KL(mu || pi)
(``tabular.anchored_optimum``) and what offline training with groups of K = 8 reaches.

    OMP_NUM_THREADS=1 python benchmarks/staleness_lab.py --lr 0.2    # about 5 minutes on one core

``--table beta-scale`` runs only the check that lambda should scale with beta (sync 32,
beta 0.05 / 0.1 / 0.2, lambda/beta 0 / 0.1 / 0.4 / 1 and lambda = 0.04); ``--table
robustness`` the sync-32 runs with another policy rank, K or number of prompts.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ggpo_lightning.lab import tabular as lab

CONFIGS = [  # label, objective, beta, anchor lambda, log-ratio bound
    ("ggpo", "ggpo", 0.1, 0.0, None),
    ("ggpo λ=0.01", "ggpo", 0.1, 0.01, None),
    ("ggpo λ=0.04", "ggpo", 0.1, 0.04, None),
    ("ggpo λ=0.1", "ggpo", 0.1, 0.1, None),
    ("ggpo β=0.3", "ggpo", 0.3, 0.0, None),
    ("ggpo bound 1", "ggpo", 0.1, 0.0, 1.0),
    ("ggpo bound 3", "ggpo", 0.1, 0.0, 3.0),
    ("grpo", "grpo", 0.1, 0.0, None),
]
SETTINGS = {"sync1": ("stale", 1), "sync8": ("stale", 8), "sync32": ("stale", 32), "offline": ("offline", 1)}


def one_run(objective: str, beta: float, anchor: float, bound: float | None, setting: str, seed: int,
            lr: float, steps: int, prompts: int = 64, policy_rank: int = 4, k: int = 8) -> tuple[float, float, float]:
    mode, sync = SETTINGS[setting]
    problem = lab.lowrank_problem(prompts, 50, beta, torch.Generator().manual_seed(seed))  # latent rank 4
    run = lab.train_tabular(problem, objective, mode=mode, steps=steps, groups=max(512, prompts), k=k, lr=lr,
                            sync_every=sync, log_every=steps, seed=seed, policy="lowrank", rank=policy_rank,
                            anchor=anchor,
                            logratio_bound=bound)
    drift = statistics.fmean(run.window_drift) if run.window_drift else run.behavior_kl[-1]
    return run.reward[-1], run.kl_to_optimum[-1], drift


def fixed_point_rows(seeds: int) -> None:
    print(f"\noffline fixed point, one prompt, 6 actions, beta 0.5, seeds 0-{seeds - 1}, mean ± std\n")
    print("| lambda | lambda/beta | KL(q || pi*) | reward(q) / reward(pi*) | lab K=8: KL(pi || pi*) "
          "| lab K=8: KL(pi || q) |")
    print("|---|---|---|---|---|---|")
    for lam in (0.0, 0.01, 0.04, 0.1, 0.5):
        cols: list[list[float]] = [[], [], [], []]
        for seed in range(seeds):
            p = lab.random_problem(6, 0.5, torch.Generator().manual_seed(seed))
            star = lab.gibbs_logp(p.ref_logp, p.rewards, p.beta)
            q = lab.anchored_optimum(p.mu_logp, star, p.beta, lam)
            run = lab.train_tabular(p, "ggpo", mode="offline", steps=1500, anchor=lam, log_every=1500, seed=seed)
            reward = [(lp.exp() * p.rewards).sum().item() for lp in (q, star)]
            for col, v in zip(cols, (lab.kl_divergence(q, star).item(), reward[0] / reward[1],
                                     run.kl_to_optimum[-1], lab.kl_divergence(run.final_logp, q).item())):
                col.append(v)
        formats = (".2e", ".3f", ".2e", ".2e")
        print(f"| {lam:g} | {lam / 0.5:g} | " + " | ".join(
            f"{statistics.fmean(c):{f}} ± {statistics.stdev(c):{f}}" for c, f in zip(cols, formats)) + " |")


def beta_scale_rows(seeds: int, lr: float, steps: int) -> None:
    ratios = (0.0, 0.1, 0.4, 1.0)
    print(f"\nsync32, lr {lr}: final reward (drift per window) against lambda/beta and lambda = 0.04, "
          f"seeds 0-{seeds - 1}\n")
    print("| β | " + " | ".join(f"λ/β = {r:g}" for r in ratios) + " | λ = 0.04 |")
    print("|---|" + "---|" * (len(ratios) + 1))
    for beta in (0.05, 0.1, 0.2):
        cells = []
        for lam in [r * beta for r in ratios] + [0.04]:
            runs = [one_run("ggpo", beta, lam, None, "sync32", seed, lr, steps) for seed in range(seeds)]
            rewards = [r[0] for r in runs]
            cells.append(f"{statistics.fmean(rewards):.3f} ± {statistics.stdev(rewards):.3f} "
                         f"({statistics.fmean(r[2] for r in runs):.2f})")
        print(f"| {beta:g} | " + " | ".join(cells) + " |")


def robustness_rows(seeds: int, lr: float, steps: int) -> None:
    variants = {"policy rank 2": dict(policy_rank=2), "policy rank 8": dict(policy_rank=8),
                "policy rank 16": dict(policy_rank=16), "K = 4": dict(k=4), "256 prompts": dict(prompts=256)}
    print(f"\nsync32, lr {lr}, beta 0.1: final reward (drift per window) when one setting changes, "
          f"seeds 0-{seeds - 1}\n")
    print("| variant | λ = 0 | λ = 0.04 |\n|---|---|---|")
    for name, overrides in variants.items():
        cells = []
        for lam in (0.0, 0.04):
            runs = [one_run("ggpo", 0.1, lam, None, "sync32", seed, lr, steps, **overrides) for seed in range(seeds)]
            rewards = [r[0] for r in runs]
            cells.append(f"{statistics.fmean(rewards):.3f} ± {statistics.stdev(rewards):.3f} "
                         f"({statistics.fmean(r[2] for r in runs):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=640)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--table", choices=("all", "grid", "fixed-point", "beta-scale", "robustness"), default="all")
    args = parser.parse_args()
    if args.seeds < 2:
        parser.error("--seeds must be at least 2: every cell reports the spread over seeds")
    torch.set_num_threads(1)
    if args.table in ("all", "fixed-point"):
        fixed_point_rows(args.seeds)
    if args.table in ("all", "beta-scale"):
        beta_scale_rows(args.seeds, args.lr, args.steps)
    if args.table in ("all", "robustness"):
        robustness_rows(args.seeds, args.lr, args.steps)
    if args.table not in ("all", "grid"):
        return
    results = {(label, s): [one_run(o, b, a, bd, s, seed, args.lr, args.steps) for seed in range(args.seeds)]
               for label, o, b, a, bd in CONFIGS for s in SETTINGS}
    for i, metric in enumerate(("final mean reward", "final KL(pi || pi*)", "drift KL(mu || pi)")):
        print(f"\n{metric} (lr {args.lr}, {args.steps} steps, seeds 0-{args.seeds - 1}, mean ± std)\n")
        print("| config | " + " | ".join(SETTINGS) + " |\n|---|" + "---|" * len(SETTINGS))
        for label, *_ in CONFIGS:
            cells = [[r[i] for r in results[label, s]] for s in SETTINGS]
            print(f"| {label} | " + " | ".join(f"{statistics.fmean(c):.3f} ± {statistics.stdev(c):.3f}"
                                             for c in cells) + " |")


if __name__ == "__main__":
    main()
