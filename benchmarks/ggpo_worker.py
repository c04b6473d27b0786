"""One timed ``ggpo-train`` run on a benchmark folder (``workload.build_artifacts``); prints ``RESULT {...}`` as
``trl_worker.py`` does.

    .venv/bin/python benchmarks/ggpo_worker.py --artifacts runs/bench/m30 --steps 40 --threads 1 [--bf16]

The workload is ``workload.py``'s; the reward is ``first_integer.py``'s verifier. Settings
that make ``ggpo-train`` do what TRL does by default: AdamW fused (TRL's ``adamw_torch_fused``),
the learning rate decayed linearly to 0 over the run (``model.lr_scheduler``). Differences
that remain: TRL's loss is GRPO (``dapo`` token averaging), ours GGPO (``-- --model.objective.name=grpo``
for ours); the reference is never refreshed in either. ``benchmarks/vs_trl.py`` runs this script
alternately with ``trl_worker.py``; extra ``ggpo-train`` flags go after ``--``.

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
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).parent))  # first_integer, phase_timer and workload: the scripts beside this one

from phase_timer import PhaseTimer
from workload import (BETA, K, MAX_GRAD_NORM, MAX_NEW_TOKENS, PROMPTS_PER_STEP, TEMPERATURE, peak_rss_mb, report,
                      step_summary, worker_parser)


def main() -> None:
    parser = worker_parser(__doc__)
    parser.add_argument("--val-every", type=int, default=0,
                        help="also greedy accuracy every N steps (left out of the step times); 0 = before and after only")
    parser.add_argument("extra", nargs="*", help="more ggpo-train flags (after --)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from ggpo_lightning.cli.train import run_training

    start = time.perf_counter()
    cli = run_training(_flags(args))
    timer = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PhaseTimer))
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    facts = timer.facts
    result = {
        "system": "ggpo", "precision": "bf16" if args.bf16 else "fp32", "artifacts": str(args.artifacts),
        "n_params": facts["n_params"], "steps": args.steps, **step_summary(timer.records),
        "peak_rss_mb": round(peak_rss_mb(), 1), "rss_after_load_mb": round(facts["rss_after_load_mb"], 1),
        "peak_rss_mb_before_train": round(facts["peak_rss_mb_before_train"], 1),
        "greedy_test_acc_before": summary["accuracy_before"], "greedy_test_acc_after": summary["accuracy_after"],
        "setup_s": round(facts["setup_done"] - start, 2), "torch_threads": torch.get_num_threads(),
        "accuracy_curve": timer.curve,
    }
    report(result, timer.records, args.out)


def _flags(args: argparse.Namespace) -> list[str]:
    """``ggpo-train``'s command line for the workload (``workload.py``), then ``args.extra``."""
    art = args.artifacts.resolve()
    run_root = args.out.with_suffix("") if args.out else art / "ggpo_runs"
    return [
        f"--seed_everything={args.seed}",
        "--trainer.accelerator=cpu", "--trainer.devices=1",
        f"--trainer.precision={'bf16-mixed' if args.bf16 else '32-true'}",
        f"--trainer.max_steps={args.steps}", f"--trainer.val_check_interval={args.val_every or args.steps + 1}",
        f"--trainer.gradient_clip_val={MAX_GRAD_NORM}", "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={run_root}",
        "--checkpoint.save_last=false", f"--checkpoint.every_n_train_steps={10 * args.steps}",
        "--summary.export=false",
        "--model.verifier_health.max_zero_reward_steps=null",  # a timing run on random weights may score 0 throughout
        f"--model.model_name_or_path={art / 'model'}",
        "--model.objective.name=ggpo", f"--model.objective.beta={BETA}", "--model.ref_refresh_every=0",
        f"--model.rollout.k={K}", "--model.rollout.sync_every=1",
        f"--model.rollout.sampling.temperature={TEMPERATURE}", "--model.rollout.sampling.top_p=1.0",
        f"--model.rollout.sampling.max_new_tokens={MAX_NEW_TOKENS}",
        f"--model.rollout.sampling.generation_batch_size={PROMPTS_PER_STEP * K}",
        '--model.verifier={"class_path": "first_integer.FirstIntegerVerifier"}',
        "--model.optimizer=torch.optim.AdamW", f"--model.optimizer.lr={args.lr}",
        "--model.optimizer.weight_decay=0.0", "--model.optimizer.fused=true",  # TRL's default: adamw_torch_fused
        "--model.lr_scheduler.decay=linear", "--model.lr_scheduler.min_lr_ratio=0.0",  # TRL's default schedule
        f"--data.train_path={art / 'data' / 'train.jsonl'}", f"--data.val_path={art / 'data' / 'test.jsonl'}",
        f"--data.val_size={args.eval_n}", f"--data.prompts_per_step={PROMPTS_PER_STEP}", "--data.mode=online",
        f"--data.seed={args.seed}", '--trainer.callbacks+={"class_path": "phase_timer.PhaseTimer"}', *args.extra,
    ]


if __name__ == "__main__":
    main()
