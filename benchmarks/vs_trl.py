"""ggpo-train against TRL's GRPOTrainer on the same model, data and workload, side by side.

    .venv/bin/pip install -e ".[bench]"      # TRL, for the benchmarks only
    .venv/bin/python benchmarks/vs_trl.py --steps 40 --out runs/vs_trl

1. Builds the model folders and data once (``workload.build_artifacts``, the package's own
   tiny-model code, offline): ``tiny`` (1.05M parameters, 1500 supervised warm-up steps) and
   ``m30`` (33.6M, 150 steps), under ``--artifacts``.
2. For each model and precision (fp32, bf16), runs ``benchmarks/trl_worker.py`` (TRL's
   ``GRPOTrainer``) and ``benchmarks/ggpo_worker.py`` (``ggpo-train``), each in its own
   process, one after the other (the order alternates between rounds), with the same
   workload (``workload.py``): 8 prompts x K=8, temperature 1, at most 16 new tokens, beta
   0.04, AdamW lr 1e-4, clip 1.0, ``--steps`` steps, one torch thread.
3. Runs both systems longer on tiny (``--learning-steps`` at ``--learning-lr``, fp32) and
   compares sampled reward and greedy held-out accuracy: speed must not cost learning.
4. Measures this machine's matmul rate (one thread, a large square matmul, fp32 and
   bf16) and the utilization of ggpo's learner update on m30 with long responses:
   ``6 * parameters * tokens / seconds / peak`` (``--util-response-len`` tokens sampled
   from the randomly initialised m30, which rarely stops early).

``--compile`` adds ``ggpo-compile`` (``ggpo-train`` with ``model.compile: true``) to the table and the compiled
update beside the eager one to the utilization.

Prints per system the median s/step (step 1 excluded), completions/s, tokens/s, peak RSS,
the time split, the reward curve and the ratios ggpo/TRL; writes everything as JSON to
``--out``. On a shared machine absolute times drift: read the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from workload import MODELS, PHASES, build_artifacts

SYSTEM_FLAGS = {  # ggpo-train flags of each variant of ours
    "ggpo": [], "ggpo-grpo": ["--model.objective.name=grpo"],
    "ggpo-async": ["--model.rollout.schedule=async", "--model.rollout.max_staleness=1"],
    "ggpo-compile": ["--model.compile=true"],
}


def run_system(system: str, artifacts: Path, steps: int, bf16: bool, out: Path, lr: float = 1e-4, seed: int = 42,
               val_every: int = 0) -> dict:
    """One training run in a fresh process; its ``RESULT`` JSON (the full one, from ``out``).

    ``system``: ``trl``, ``ggpo``, ``ggpo-grpo`` (``ggpo-train`` with its GRPO objective), ``ggpo-async``
    (rollouts in a child process while the learner trains, ``recipes/overlays/async.yaml``: two processes of
    one thread each, so up to two cores against TRL's one) or ``ggpo-compile`` (``model.compile: true``: its
    compiles fall in the first steps; the medians leave out step 1 only)."""
    script = ROOT / "benchmarks" / ("trl_worker.py" if system == "trl" else "ggpo_worker.py")
    cmd = [sys.executable, str(script), "--artifacts", str(artifacts), "--steps", str(steps), "--threads", "1",
           "--lr", str(lr), "--seed", str(seed), "--out", str(out)] + (["--bf16"] if bf16 else [])
    if system != "trl" and val_every:
        cmd += ["--val-every", str(val_every)]
    cmd += ["--", *SYSTEM_FLAGS[system]] if SYSTEM_FLAGS.get(system) else []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode:
        raise SystemExit(f"{system} on {artifacts.name} failed ({proc.returncode}); see {log}")
    result = json.loads(out.read_text())
    result.pop("per_step")
    return result


def matmul_peak(dtype_name: str, sizes: tuple[int, ...] = (1024, 2048, 4096), repeat: int = 5,
                slow_s: float = 1.0) -> float:
    """FLOP/s of the fastest ``n x n`` square matmul on one thread (the best of ``repeat`` per size).

    Sizes go up in order; once a first matmul takes longer than ``slow_s`` it is the size's only timing and no
    larger size is tried (each costs 8x more): on a CPU without bfloat16 instructions a 4096 bf16 matmul takes
    minutes (0.3 GFLOP/s on an AMD EPYC), and the rate has long stopped rising."""
    import torch

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    rates = []
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        start = time.perf_counter()
        a @ b  # warm-up
        best = time.perf_counter() - start
        for _ in range(repeat if best <= slow_s else 0):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        rates.append(2 * n**3 / best)
        if best > slow_s:
            break
    return max(rates)


def summarize(model: str, precision: str, runs: dict[str, list[dict]]) -> dict:
    """Per-system medians over rounds and the ratios ggpo/TRL."""
    import statistics

    def med(system: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[system])

    row = {"model": model, "precision": precision, "n_params": runs["ggpo"][0]["n_params"], "systems": list(runs)}
    for system in runs:
        row[system] = {
            "sec_per_step": med(system, "sec_per_step_median_excl_first"),
            "completions_per_sec": med(system, "completions_per_sec"),
            "total_tokens_per_sec": med(system, "total_tokens_per_sec"),
            "peak_rss_mb": med(system, "peak_rss_mb"),
            "phase_s": runs[system][-1]["phase_median_s"],
            "reward_per_step": runs[system][-1]["reward_per_step"],
            "reward_first10": med(system, "reward_mean_first10"), "reward_last10": med(system, "reward_mean_last10"),
            "greedy_acc_before": med(system, "greedy_test_acc_before"),
            "greedy_acc_after": med(system, "greedy_test_acc_after"),
            "mean_completion_len": med(system, "mean_completion_len"),
        }
    row["ratio"] = {system: {k: row[system][k] / row["trl"][k]
                             for k in ("completions_per_sec", "total_tokens_per_sec", "peak_rss_mb", "sec_per_step")}
                    for system in runs if system != "trl"}
    return row


def print_table(rows: list[dict]) -> None:
    print("\n| model | precision | system | s/step | completions/s | tokens/s | peak RSS MB | "
          "generate / verify / learner fwd / ref fwd / backward / optimizer (s) | reward first10 -> last10 | "
          "greedy acc before -> after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for system in row["systems"]:
            s = row[system]
            split = " / ".join(f"{s['phase_s'][k]:.3f}" for k in PHASES)
            print(f"| {row['model']} | {row['precision']} | {system} | {s['sec_per_step']:.3f} | "
                  f"{s['completions_per_sec']:.1f} | {s['total_tokens_per_sec']:.0f} | {s['peak_rss_mb']:.0f} | "
                  f"{split} | {s['reward_first10']:.3f} -> {s['reward_last10']:.3f} | "
                  f"{s['greedy_acc_before']:.3f} -> {s['greedy_acc_after']:.3f} |")
        for system, r in row["ratio"].items():
            print(f"| {row['model']} | {row['precision']} | **{system}/TRL** | {r['sec_per_step']:.2f}x | "
                  f"**{r['completions_per_sec']:.2f}x** | {r['total_tokens_per_sec']:.2f}x | "
                  f"**{r['peak_rss_mb']:.2f}x** | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=ROOT / "runs" / "bench", help="where the models are built")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "vs_trl")
    parser.add_argument("--models", default="tiny,m30")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1, help="runs per system and setting (order alternates)")
    parser.add_argument("--async", dest="with_async", action="store_true",
                        help="also ggpo-train with asynchronous rollouts (two single-thread processes)")
    parser.add_argument("--compile", action="store_true",
                        help="also ggpo-train with model.compile: true (and the utilization compiled beside eager)")
    parser.add_argument("--sft-steps", type=int, help="override the models' warm-up steps (0 for a smoke run)")
    parser.add_argument("--util-response-len", type=int, default=256, help="0 = skip the utilization measurement")
    parser.add_argument("--util-model", choices=sorted(MODELS), default="m30", help="the utilization model's shape")
    parser.add_argument("--learning-steps", type=int, default=200,
                        help="a longer run of both systems on tiny (fp32) to compare learning; 0 = skip")
    parser.add_argument("--learning-lr", type=float, default=5e-4)
    parser.add_argument("--learning-seeds", default="42,43,44", help="one learning run per system and seed")
    parser.add_argument("--learning-val-every", type=int, default=100,
                        help="ours: greedy held-out accuracy every N steps of the learning runs")
    args = parser.parse_args()
    models, precisions = [m for m in args.models.split(",") if m], args.precisions.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    for model in models:
        build_artifacts(args.artifacts, model, args.sft_steps)
    ours = ["ggpo"] + ["ggpo-async"] * args.with_async + ["ggpo-compile"] * args.compile

    rows: list[dict] = []
    for model in models:
        for precision in precisions:
            runs: dict[str, list[dict]] = {system: [] for system in ["trl", *ours]}
            for rnd in range(args.rounds):
                for system in (list(runs) if rnd % 2 == 0 else list(runs)[::-1]):
                    out = args.out / f"{model}_{precision}_{system}_r{rnd}.json"
                    result = run_system(system, args.artifacts / model, args.steps, precision == "bf16", out)
                    runs[system].append(result)
                    print(f"{model} {precision} {system} round {rnd}: {result['sec_per_step_median_excl_first']:.3f} "
                          f"s/step, {result['completions_per_sec']:.1f} completions/s, "
                          f"peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
            rows.append(summarize(model, precision, runs))
    peaks = {name: matmul_peak(name) for name in ("float32", "bfloat16")}
    print(f"\nmatmul peak, 1 thread, best square matmul of 1024/2048/4096: fp32 {peaks['float32'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {peaks['bfloat16'] / 1e9:.0f} GFLOP/s")
    if rows:
        print_table(rows)
    report = {"rows": rows, "matmul_peak_flops": peaks, "steps": args.steps, "rounds": args.rounds}
    if args.learning_steps:
        report["learning"] = learning_check(args)
    if args.util_response_len:
        report["utilization"] = learner_utilization(args, peaks)
    (args.out / "vs_trl.json").write_text(json.dumps(report, indent=2))
    print(f"\nwritten to {args.out / 'vs_trl.json'}")


def learning_check(args: argparse.Namespace) -> dict:
    """Both systems for ``--learning-steps`` on tiny at ``--learning-lr``, once per seed: does speed cost learning?

    ``ggpo-train`` runs twice, with GGPO and with its GRPO objective, so a difference in
    learning can be put on the trainer or on the objective. Ours also evaluate every
    ``--learning-val-every`` steps (off their training clock): per seed, the share of TRL's
    training wall time at which ours first reach TRL's final greedy accuracy (None: never)."""
    import statistics

    build_artifacts(args.artifacts, "tiny", args.sft_steps)
    rows = {}
    for system in ("trl", "ggpo", "ggpo-grpo"):  # ggpo-train's GRPO: trainer and objective told apart
        runs = [run_system(system, args.artifacts / "tiny", args.learning_steps, False,
                           args.out / f"learning_tiny_{system}_seed{seed}.json", lr=args.learning_lr, seed=int(seed),
                           val_every=args.learning_val_every)
                for seed in args.learning_seeds.split(",")]
        curves = [r["reward_per_step"] for r in runs]
        rows[system] = {
            "seeds": args.learning_seeds,
            "reward_first50": statistics.mean(statistics.mean(c[:50]) for c in curves),
            "reward_last50": statistics.mean(statistics.mean(c[-50:]) for c in curves),
            "reward_last50_per_seed": [statistics.mean(c[-50:]) for c in curves],
            "greedy_acc_before": statistics.mean(r["greedy_test_acc_before"] for r in runs),
            "greedy_acc_after": statistics.mean(r["greedy_test_acc_after"] for r in runs),
            "greedy_acc_after_per_seed": [r["greedy_test_acc_after"] for r in runs],
            "sec_per_step": statistics.median(r["sec_per_step_median_excl_first"] for r in runs),
            "reward_per_step_mean": [statistics.mean(v) for v in zip(*curves)],
            "train_wall_s_per_seed": [r["train_wall_s"] for r in runs],
        }
        row = rows[system]
        if system != "trl":
            row["share_of_trl_time_to_trl_final_acc"] = [
                time_to_reach(r.get("accuracy_curve", []), trl["greedy_test_acc_after"], trl["train_wall_s"])
                for r, trl in zip(runs, trl_runs)]
        else:
            trl_runs = runs
        print(f"learning, tiny fp32, {args.learning_steps} steps at lr {args.learning_lr}, seeds "
              f"{args.learning_seeds}, {system}: sampled reward {row['reward_first50']:.3f} (first 50) -> "
              f"{row['reward_last50']:.3f} (last 50; per seed "
              f"{', '.join(f'{x:.3f}' for x in row['reward_last50_per_seed'])}), greedy accuracy "
              f"{row['greedy_acc_before']:.3f} -> {row['greedy_acc_after']:.3f} (per seed "
              f"{', '.join(f'{x:.3f}' for x in row['greedy_acc_after_per_seed'])}), {row['sec_per_step']:.3f} s/step"
              + ("" if system == "trl" else ", TRL's final accuracy reached at " + ", ".join(
                  "never" if x is None else f"{x:.2f}" for x in row["share_of_trl_time_to_trl_final_acc"])
                 + " of TRL's training time (per seed)"),
              flush=True)
    return rows


def time_to_reach(curve: list[dict], accuracy: float, reference_seconds: float) -> float | None:
    """The training seconds of the first point of ``curve`` at or above ``accuracy``, over ``reference_seconds``."""
    reached = next((p["train_seconds"] for p in curve if p["accuracy"] >= accuracy - 1e-9), None)
    return None if reached is None else reached / reference_seconds


def learner_utilization(args: argparse.Namespace, peaks: dict[str, float]) -> dict:
    """Runs ``benchmarks/learner_update.py`` on a randomly initialised ``--util-model`` (m30) and relates it to the
    matmul peak."""
    out = args.out / "learner_update.json"
    build_artifacts(args.artifacts, args.util_model, args.sft_steps)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learner_update.py"),
                    "--like", str(args.artifacts / args.util_model / "model"), "--response-len", str(args.util_response_len),
                    "--precisions", "bf16", "--repeat", "2", "--out", str(out)] + ["--compile"] * args.compile,
                   check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    result = json.loads(out.read_text())
    for run in result["runs"]:
        peak = peaks["bfloat16" if run["precision"] == "bf16" else "float32"]
        run["utilization_of_same_precision_peak"] = run["model_flops_per_s"] / peak
        run["utilization_of_bf16_peak"] = run["model_flops_per_s"] / peaks["bfloat16"]
        print(f"learner update, {args.util_model}, {run['precision']}{', compiled' if run['compile'] else ''}, "
              f"{run['tokens']} tokens/step: {run['seconds']:.3f} s, "
              f"{run['model_flops_per_s'] / 1e9:.0f} GFLOP/s = {100 * run['utilization_of_bf16_peak']:.0f}% of the "
              f"bf16 matmul peak ({100 * run['utilization_of_same_precision_peak']:.0f}% of its own precision's)"
              + (f"; compile {run['compile_seconds']:.0f} s" if run["compile"] else ""))
    return result


if __name__ == "__main__":
    main()
