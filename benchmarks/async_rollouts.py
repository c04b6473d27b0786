"""Synchronous vs asynchronous rollouts on the quickstart: wall time to accuracy, and accuracy against samples.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async_rollouts.py --out runs/async_bench
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async_rollouts.py --objectives ggpo --seeds 0,1 --steps 400
    ... async_rollouts.py --steps 4 --val-every 2 -- --tiny_model.sft_steps=5   # more ggpo-train flags after --

Each run is ``ggpo-train --config recipes/quickstart.yaml`` (GGPO, or GRPO with
``recipes/baselines/grpo.yaml``), ``model.rollout.schedule`` ``sync`` or ``async``
(``recipes/overlays/async.yaml``: ``max_staleness`` = ``sync_every`` = 1), one torch thread per Python thread, in a
fresh process, one run at a time, with held-out accuracy (greedy pass@1, the quickstart's
512 sums) every ``--val-every`` steps. The clock is the training loop's: it starts after
the starting model's evaluation and leaves out the held-out evaluations themselves (the
same prompts and cost in both modes; async mode pauses its producer for them).

Printed per run: seconds per step, final accuracy, the seconds to first reach the
synchronous run's final accuracy (same objective and seed) and the speed-up over the
synchronous run's full time; then the accuracy curves against samples trained on
(optimizer steps x prompts x K; the producer generates at most ``max_staleness + 1``
batches more, left unused at the end). The model and data are built once under
``--out`` by the first run. Figures on a shared machine are noisy: the load average and
the machine's parallel capacity (two single-thread matmul processes' throughput over one
process's: 2.0 on two free cores) are printed; async mode can only gain what that allows.
Also printed per run: the other work's CPU use while it ran (all cores' busy time from
``/proc/stat`` minus the run's own processes', in cores), the figure that says whether the
cores were free. Note that ``nice`` alone does not keep other work off them where the
kernel groups processes by session (``/proc/sys/kernel/sched_autogroup_enabled`` = 1):
each session's group gets an equal share whatever its processes' nice values; give the
other sessions' groups nice 19 too (``echo 19 > /proc/PID/autogroup``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def worker(args: argparse.Namespace) -> None:
    """One ``ggpo-train`` run, its validations timed on the training clock; writes ``curve.json`` to ``--run-dir``."""
    import torch

    from ggpo_lightning.training.module import GGPOModule
    from ggpo_lightning.cli.train import run_training

    torch.set_num_threads(1)
    clock = {"start": None, "eval": 0.0}
    curve = []
    on_train_start, evaluate = GGPOModule.on_train_start, GGPOModule.evaluate

    def timed_start(self):
        on_train_start(self)
        clock["start"] = time.perf_counter()

    def timed_evaluate(self, rows):
        start = time.perf_counter()
        accuracy = evaluate(self, rows)
        end = time.perf_counter()
        if self.trainer.validating:  # not the starting and final evaluations of RunSummary
            clock["eval"] += end - start
            curve.append({"step": self.global_step, "seconds": end - clock["start"] - clock["eval"],
                          "accuracy": accuracy})
        return accuracy

    GGPOModule.on_train_start, GGPOModule.evaluate = timed_start, timed_evaluate
    run_dir = Path(args.run_dir)
    configs = ["--config", str(RECIPES / "quickstart.yaml")]
    if args.objective == "grpo":
        configs += ["--config", str(RECIPES / "baselines" / "grpo.yaml")]
    if args.mode == "async":
        configs += ["--config", str(RECIPES / "overlays" / "async.yaml")]
    cli = run_training([*configs, "--seed_everything", str(args.seed), "--data.seed", str(args.seed),
                        "--trainer.max_steps", str(args.steps), "--trainer.val_check_interval", str(args.val_every),
                        "--trainer.enable_progress_bar", "false", "--summary.export", "false",
                        "--checkpoint.every_n_train_steps", str(args.steps),
                        "--trainer.logger.init_args.save_dir", str(run_dir.parent), *args.extra])
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    phases = phase_medians(Path(cli.trainer.log_dir) / "metrics.csv")
    (run_dir / "curve.json").write_text(json.dumps({"curve": curve, "summary": summary, "phases": phases}, indent=1))


PHASES = ("train/train_seconds", "train/rollout_seconds", "train/rollout_wait_seconds")


def phase_medians(metrics_csv: Path) -> dict[str, float]:
    """Median seconds per step of the update, the rollout (in async mode: in the producer, overlapping) and the
    learner's wait for a batch, over the run's steps after the first 10 (the child process starts in the first)."""
    import csv
    import statistics

    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("train/train_seconds")][10:]
    return {key: statistics.median(float(r[key]) for r in rows) for key in PHASES if rows and rows[0].get(key)}


def run(args: argparse.Namespace, objective: str, mode: str, seed: int) -> dict:
    run_dir = Path(args.out) / f"{objective}-{mode}-{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--worker", "--objective", objective, "--mode", mode, "--seed", str(seed),
               "--steps", str(args.steps), "--val-every", str(args.val_every), "--run-dir", str(run_dir),
               "--", *args.extra]
    load = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    busy_before, own_before, start = busy_cpu_seconds(), own_children_cpu_seconds(), time.monotonic()
    subprocess.run(command, check=True, cwd=args.out, env=env, stdout=subprocess.DEVNULL)
    others = (busy_cpu_seconds() - busy_before) - (own_children_cpu_seconds() - own_before)
    result = json.loads((run_dir / "curve.json").read_text())
    result["load_before"] = load
    result["other_cores"] = max(0.0, others) / (time.monotonic() - start)
    result["capacity_after"] = parallel_capacity()
    return result


def busy_cpu_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_children_cpu_seconds() -> float:
    """CPU seconds of this process's finished children (a run and the processes it waited for)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _spin(seconds: float, result) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a
        count += 1
    result.put(count)


def parallel_capacity(seconds: float = 3.0) -> float:
    """How many single-thread matmul loops this machine runs side by side right now: two processes' work over one
    process's (2.0 on two free cores; less when other work shares them)."""
    import multiprocessing as mp

    context = mp.get_context("spawn")
    totals = []
    for n in (1, 2):
        queue = context.Queue()
        workers = [context.Process(target=_spin, args=(seconds, queue)) for _ in range(n)]
        for w in workers:
            w.start()
        totals.append(sum(queue.get() for _ in workers))
        for w in workers:
            w.join()
    return totals[1] / totals[0]


def time_to(curve: list[dict], accuracy: float) -> float | None:
    """Training-clock seconds at the first validation reaching ``accuracy`` (None: never)."""
    return next((p["seconds"] for p in curve if p["accuracy"] >= accuracy - 1e-9), None)


def print_seed_means(results: dict, steps: int) -> None:
    """Per objective, over seeds: the sync runs' mean final accuracy as the target, the seconds at which the
    seed-averaged async curve (accuracy and training seconds averaged per validation step) first reaches it, and
    the mean seconds per update of each mode. Averaging the curves over seeds halves the held-out noise that
    decides a single run's "first reached" (one 512-prompt accuracy has a standard error of ~1.2 points)."""
    print("\n  over seeds: sync final acc (target) / s   async final acc / s   async s to target   speed-up   "
          "per update")
    for objective in dict.fromkeys(o for o, _, _ in results):
        runs = {mode: [r for (o, m, _), r in results.items() if o == objective and m == mode] for mode in MODES}
        if not runs["sync"] or len(runs["sync"]) != len(runs["async"]):
            continue
        means = {mode: mean_curve([r["curve"] for r in rs]) for mode, rs in runs.items()}
        target, sync_seconds = means["sync"][-1]["accuracy"], means["sync"][-1]["seconds"]
        reached = time_to(means["async"], target)
        final = means["async"][-1]
        print(f"  {objective:9} ({len(runs['sync'])} seeds)  {target:.3f} / {sync_seconds:6.1f}   "
              f"{final['accuracy']:.3f} / {final['seconds']:6.1f}   "
              f"{'never' if reached is None else f'{reached:6.1f}':>17}   "
              f"{'-' if reached is None else f'{sync_seconds / reached:.2f}x':>8}   "
              f"{sync_seconds / final['seconds']:.2f}x ({sync_seconds / steps:.3f} vs {final['seconds'] / steps:.3f} s)")


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """Accuracy and seconds averaged over runs at each validation step they share."""
    steps = sorted(set.intersection(*({p["step"] for p in c} for c in curves)))
    by_step = [{p["step"]: p for p in c} for c in curves]
    return [{"step": s, "accuracy": sum(c[s]["accuracy"] for c in by_step) / len(curves),
             "seconds": sum(c[s]["seconds"] for c in by_step) / len(curves)} for s in steps]


MODES = ("sync", "async")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/async_bench")
    parser.add_argument("--objectives", default="ggpo,grpo")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--val-every", type=int, default=50)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--objective", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="more ggpo-train flags for every run (after --)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.out = str(Path(args.out).resolve())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, load average before: {os.getloadavg()}, parallel capacity "
          f"{parallel_capacity():.2f} of 2, OMP_NUM_THREADS=1, {args.steps} steps, held-out accuracy every "
          f"{args.val_every}", flush=True)
    results = {}
    for objective in args.objectives.split(","):
        for seed in map(int, args.seeds.split(",")):
            for mode in MODES:
                results[objective, mode, seed] = r = run(args, objective, mode, seed)
                final = r["curve"][-1]
                print(f"{objective:5} {mode:5} seed {seed}: {final['seconds'] / args.steps:.3f} s/step, accuracy "
                      f"{r['summary']['accuracy_before']:.3f} -> {final['accuracy']:.3f} in {final['seconds']:.1f} s "
                      f"(load average before the run {r['load_before']:.2f}; other work used {r['other_cores']:.2f} cores "
                      f"during it; "
                      f"parallel capacity just after {r['capacity_after']:.2f} of 2)", flush=True)
                print("    medians per step: " + ", ".join(f"{k.split('/')[1]} {v:.3f} s" for k, v in r["phases"].items()),
                      flush=True)
    print("\n  objective seed  sync: acc / s   async: acc / s   async s to sync's final acc   speed-up")
    for (objective, mode, seed), r in results.items():
        if mode != "async":
            continue
        sync = results[objective, "sync", seed]
        target, sync_seconds = sync["curve"][-1]["accuracy"], sync["curve"][-1]["seconds"]
        reached = time_to(r["curve"], target)
        final = r["curve"][-1]
        print(f"  {objective:9} {seed:4}  {target:.3f} / {sync_seconds:6.1f}   {final['accuracy']:.3f} / "
              f"{final['seconds']:6.1f}   {'never' if reached is None else f'{reached:6.1f}':>27}   "
              f"{'-' if reached is None else f'{sync_seconds / reached:.2f}x':>8}")
    print_seed_means(results, args.steps)
    print("\n  accuracy against samples trained on (steps x 16 prompts x K=8)")
    for (objective, mode, seed), r in results.items():
        points = " ".join(f"{p['step'] * 128 // 1000}k:{p['accuracy']:.3f}" for p in r["curve"])
        print(f"  {objective:5} {mode:5} seed {seed}: {points}")
    (Path(args.out) / "results.json").write_text(json.dumps({f"{o}-{m}-{s}": r for (o, m, s), r in results.items()},
                                                            indent=1))


if __name__ == "__main__":
    main()
