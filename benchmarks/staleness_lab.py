"""The staleness comparison of docs/METHOD.md#lab-evidence, on the shared-parameter tabular lab.

GGPO with behavior-anchor lambda in {0, 0.01, 0.04, 0.1}, GGPO at a larger beta, GGPO
with a log-ratio bound, and GRPO, each at sync 1 / 8 / 32 and offline (mu = pi_ref),
over seeds 0, 1, 2 (problem, initialization and sampling seed). Prints markdown tables
of final mean reward, KL(pi || pi*) and drift KL(mu || pi) at window ends (mean over
windows; offline: KL(mu || pi) at the end), as mean ± sample std over seeds.

    OMP_NUM_THREADS=1 python benchmarks/staleness_lab.py --lr 0.2    # about 3 minutes on one core
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ggpo_lightning import tabular as lab

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
            lr: float, steps: int) -> tuple[float, float, float]:
    mode, sync = SETTINGS[setting]
    problem = lab.lowrank_problem(64, 50, beta, torch.Generator().manual_seed(seed))
    run = lab.train_tabular(problem, objective, mode=mode, steps=steps, groups=512, k=8, lr=lr, sync_every=sync,
                            log_every=steps, seed=seed, policy="lowrank", rank=4, anchor=anchor,
                            logratio_bound=bound)
    drift = statistics.fmean(run.window_drift) if run.window_drift else run.behavior_kl[-1]
    return run.reward[-1], run.kl_to_optimum[-1], drift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=640)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
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
