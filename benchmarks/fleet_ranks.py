"""Two trainer processes on two vLLM servers: the async schedule against the sync one (issue 54).

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python benchmarks/fleet_ranks.py --steps 200 --rounds 1
    .venv-vllm/bin/python benchmarks/fleet_ranks.py --steps 8 --rounds 1 --val-size 16     # a smoke run

The quickstart's workload sharded over two processes (``recipes/fsdp-cpu-2proc.yaml``: FSDP2 on gloo, 16 prompts x
K=8 per update) generating on two local vLLM servers of the quickstart's model (``LocalFleet``, started once, one
torch thread each), ``--model.rollout.sync_every`` ``--sync-every``; ``sync`` (generation and training take turns,
each rank sends its own prompts) and ``async`` (``recipes/overlays/async.yaml``: rank 0's producer rolls out every
rank's prompts while both ranks train; staleness bound ``sync_every``). Each run is ``ggpo-train`` in a fresh
process group, one at a time, ``--rounds`` times per schedule in alternating order. The model and data are built
once under ``--out`` (one short quickstart run).

Printed per run: updates per second over the run's wall clock (both held-out evaluations of ``--val-size`` prompts,
the same in both schedules, included), the median seconds per update of the learner's update and of its wait for
groups (sync: the rollout itself; async: the wait for rank 0's producer), the held-out greedy accuracy before and
after, and the largest staleness seen; then the ratio async / sync of updates per second. Four vLLM processes per
server and two trainer processes share this machine's cores: the figures say what the schedule gains where the
cores are that few, not what it gains on GPUs, where the servers' and the learner's devices are apart.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def build_quickstart(out: Path) -> Path:
    """The quickstart's model and data under ``out/runs/quickstart`` (built by one short run when missing)."""
    model = out / "runs" / "quickstart" / "tiny-model"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "ggpo_lightning.cli.train", "--config", str(RECIPES / "quickstart.yaml"),
                        "--trainer.max_steps", "1", "--data.val_size", "8", "--summary.export", "false",
                        "--trainer.logger.init_args.name", "build"], cwd=out, check=True, capture_output=True)
    return model


def train(out: Path, schedule: str, urls: list[str], args: argparse.Namespace) -> dict:
    """One two-process run; its summary and per-step medians."""
    name = f"{schedule}-{time.strftime('%H%M%S')}"
    overlay = ["--config", str(RECIPES / "overlays" / "async.yaml")] if schedule == "async" else []
    command = [sys.executable, "-m", "ggpo_lightning.cli.train", "--config", str(RECIPES / "fsdp-cpu-2proc.yaml"),
               *overlay, "--model.rollout.engine", "vllm_server", "--model.rollout.servers", json.dumps(urls),
               "--model.rollout.sync_every", str(args.sync_every), "--trainer.max_steps", str(args.steps),
               "--trainer.val_check_interval", str(args.steps), "--data.val_size", str(args.val_size),
               "--trainer.enable_progress_bar", "false", "--summary.export", "false",
               "--trainer.logger.init_args.name", name]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=args.timeout,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        raise SystemExit(f"{schedule} run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    run_dir = out / "runs" / name / "version_0"  # the logger's name is the run's
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("train/train_seconds")]
    wait = "train/rollout_wait_seconds" if schedule == "async" else "train/rollout_seconds"
    steady = rows[min(2, len(rows) - 1):]  # the first updates start the producer and the servers' caches
    return {"schedule": schedule, "wall": time.perf_counter() - started, "summary": summary,
            "update_s": statistics.median(float(r["train/train_seconds"]) for r in steady),
            "wait_s": statistics.median(float(r[wait]) for r in steady),
            "staleness_max": max(float(r["train/staleness_max"]) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--val-size", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ggpo-fleet-ranks"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from ggpo_lightning.rollouts.fleet.launcher import LocalFleet

    model = build_quickstart(args.out)
    fleet = LocalFleet(str(model), 2, log_dir=args.out / "servers", dtype="float32",
                       extra_args=["--kv-cache-memory-bytes", str(64 << 20)])
    fleet.start()
    results = []
    try:
        for round_ in range(args.rounds):
            for schedule in (("sync", "async") if round_ % 2 == 0 else ("async", "sync")):
                results.append(train(args.out, schedule, fleet.urls, args))
                r = results[-1]
                s = r["summary"]
                print(f"{schedule:5s} {s['optimizer_steps']} updates in {s['wall_seconds']:.1f} s: "
                      f"{s['optimizer_steps'] / s['wall_seconds']:.2f} updates/s; per update: learner "
                      f"{r['update_s']:.3f} s, wait for groups {r['wait_s']:.3f} s; held-out accuracy "
                      f"{s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f}; staleness max "
                      f"{r['staleness_max']:.0f}", flush=True)
    finally:
        fleet.stop()
    rate = {k: [r["summary"]["optimizer_steps"] / r["summary"]["wall_seconds"] for r in results
                if r["schedule"] == k] for k in ("sync", "async")}
    ratios = [a / s for a, s in zip(rate["async"], rate["sync"])]
    print(f"async / sync updates per second: {', '.join(f'{x:.2f}' for x in ratios)} "
          f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
