"""One timed ``ggpo-train`` run on a peer-bench artifacts folder; prints ``RESULT {...}`` like the TRL harness.

    .venv/bin/python benchmarks/ggpo_worker.py --artifacts runs/bench/m30 --steps 40 --threads 1 [--bf16]

The workload is the peer benchmark's (``shared/peer-bench/README.md``): 8 prompts x K=8
responses per optimizer step, temperature 1, top-p 1, at most 16 new tokens, the reward
"first integer equals the gold" (``first_integer.py``), beta 0.04, AdamW lr 1e-4 without
weight decay (fused, as TRL's default ``adamw_torch_fused``), gradient-norm clip 1.0, one torch
thread, and TRL's default learning-rate schedule: linear decay to 0 over the run
(``model.lr_scheduler``). Differences that remain: TRL's
loss is GRPO (``dapo`` token averaging), ours GGPO (``-- --model.objective.name=grpo`` for ours);
the reference is never refreshed in either. ``benchmarks/vs_trl.py`` runs this script
alternately with TRL's harness; extra ``ggpo-train`` flags go after ``--``.

Timing goes through public interfaces only: a Lightning callback (a step is
``on_train_batch_start`` to ``on_train_batch_end``, the rollout included, which the online
data path runs inside the step; backward between ``on_before_backward`` and
``on_after_backward``; clipping and the optimizer from ``on_before_optimizer_step``), the
step's logged metrics (``train/rollout_seconds``, of which ``train/rollout_verify_seconds``;
token counts) and forward hooks on the reference model's children. ``learner_forward`` is
the rest of the step: the learner's forward with the packing and the loss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="folder made by shared/peer-bench/tiny_setup.py")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="trainer.precision bf16-mixed (default 32-true)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval-n", type=int, default=256, help="greedy accuracy on the first N test prompts")
    parser.add_argument("--val-every", type=int, default=0,
                        help="also greedy accuracy every N steps (left out of the step times); 0 = before and after only")
    parser.add_argument("--out", help="write the result JSON here")
    parser.add_argument("extra", nargs="*", help="more ggpo-train flags (after --)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))  # first_integer.FirstIntegerVerifier, phase_timer.PhaseTimer

    from phase_timer import PhaseTimer, peak_rss_mb

    from ggpo_lightning.cli.train import run_training

    art = Path(args.artifacts).resolve()
    run_root = Path(args.out).with_suffix("") if args.out else art / "ggpo_runs"
    cli_args = [
        f"--seed_everything={args.seed}",
        "--trainer.accelerator=cpu", "--trainer.devices=1",
        f"--trainer.precision={'bf16-mixed' if args.bf16 else '32-true'}",
        f"--trainer.max_steps={args.steps}", f"--trainer.val_check_interval={args.val_every or args.steps + 1}",
        "--trainer.gradient_clip_val=1.0", "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={run_root}",
        "--checkpoint.save_last=false", f"--checkpoint.every_n_train_steps={10 * args.steps}",
        "--summary.export=false",
        "--model.verifier_health.max_zero_reward_steps=null",  # a timing run on random weights may score 0 throughout
        f"--model.model_name_or_path={art / 'model'}",
        "--model.objective.name=ggpo", "--model.objective.beta=0.04", "--model.ref_refresh_every=0",
        "--model.rollout.k=8", "--model.rollout.sync_every=1",
        "--model.rollout.sampling.temperature=1.0", "--model.rollout.sampling.top_p=1.0",
        "--model.rollout.sampling.max_new_tokens=16", "--model.rollout.sampling.generation_batch_size=64",
        '--model.verifier={"class_path": "first_integer.FirstIntegerVerifier"}',
        "--model.optimizer=torch.optim.AdamW", f"--model.optimizer.lr={args.lr}",
        "--model.optimizer.weight_decay=0.0", "--model.optimizer.fused=true",  # TRL's default: adamw_torch_fused
        "--model.lr_scheduler.decay=linear", "--model.lr_scheduler.min_lr_ratio=0.0",  # TRL's default schedule
        f"--data.train_path={art / 'data' / 'train.jsonl'}", f"--data.val_path={art / 'data' / 'test.jsonl'}",
        f"--data.val_size={args.eval_n}", "--data.prompts_per_step=8", "--data.mode=online",
        f"--data.seed={args.seed}", '--trainer.callbacks+={"class_path": "phase_timer.PhaseTimer"}', *args.extra,
    ]
    start = time.perf_counter()
    cli = run_training(cli_args)
    timer = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PhaseTimer))
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    print("RESULT " + json.dumps(_result(args, timer, summary, timer.facts["setup_done"] - start, peak_rss_mb())))


def _result(args, timer, summary: dict, setup_s: float, peak_rss: float) -> dict:
    records, facts = timer.records, timer.facts
    timed = records[1:] or records  # step 1 warms up allocator and kernels
    wall = sum(r["wall_s"] for r in timed)
    median = statistics.median(r["wall_s"] for r in timed)
    keys = sorted({k for r in timed for k in r if k.startswith("t.")})
    rewards = [r["mean_reward"] for r in records]
    comps = sum(r["completions"] for r in timed)
    ctok = sum(r["completion_tokens"] for r in timed)
    ptok = sum(r["prompt_tokens"] for r in timed)
    result = {
        "system": "ggpo", "precision": "bf16" if args.bf16 else "fp32", "artifacts": str(args.artifacts),
        "n_params": facts["n_params"], "steps": args.steps,
        "sec_per_step_median_excl_first": round(median, 4),
        "completions_per_sec_at_median_step": round(64 / median, 2),
        "completions_per_sec": round(comps / wall, 2),
        "completion_tokens_per_sec": round(ctok / wall, 2),
        "total_tokens_per_sec": round((ctok + ptok) / wall, 2),
        "mean_completion_len": round(ctok / max(comps, 1), 3),
        "cpu_util_threads": round(sum(r["cpu_s"] for r in timed) / wall, 3),
        "phase_median_s": {k[2:]: round(statistics.median(r.get(k, 0.0) for r in timed), 4) for k in keys},
        "phase_share_of_step": {k[2:]: round(sum(r.get(k, 0.0) for r in timed) / wall, 4) for k in keys},
        "peak_rss_mb": round(peak_rss, 1), "rss_after_load_mb": round(facts["rss_after_load_mb"], 1),
        "peak_rss_mb_before_train": round(facts["peak_rss_mb_before_train"], 1),
        "reward_per_step": [round(x, 4) for x in rewards],
        "reward_mean_first10": round(statistics.mean(rewards[:10]), 4),
        "reward_mean_last10": round(statistics.mean(rewards[-10:]), 4),
        "greedy_test_acc_before": summary["accuracy_before"], "greedy_test_acc_after": summary["accuracy_after"],
        "setup_s": round(setup_s, 2), "torch_threads": torch.get_num_threads(),
        "train_wall_s": round(sum(r["wall_s"] for r in records), 3), "accuracy_curve": timer.curve,
        "per_step": records,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return {k: v for k, v in result.items() if k != "per_step"}


if __name__ == "__main__":
    main()
