"""One timed ``ggpo-train`` run on a peer-bench artifacts folder; prints ``RESULT {...}`` like the TRL harness.

    .venv/bin/python benchmarks/ggpo_worker.py --artifacts runs/bench/m30 --steps 40 --threads 1 [--bf16]

The workload is the peer benchmark's (``shared/peer-bench/README.md``): 8 prompts x K=8
responses per optimizer step, temperature 1, top-p 1, at most 16 new tokens, the reward
"first integer equals the gold" (``first_integer.py``), beta 0.04, AdamW lr 1e-4 without
weight decay (fused, as TRL's default ``adamw_torch_fused``), gradient-norm clip 1.0, one torch
thread, and TRL's default learning-rate schedule: linear decay to 0 over the run (added here,
benchmark-side; ``ggpo-train`` itself keeps the rate constant). Differences that remain: TRL's
loss is GRPO (``dapo`` token averaging), ours GGPO (``-- --model.objective.name=grpo`` for ours);
the reference is never refreshed in either. ``benchmarks/vs_trl.py`` runs this script
alternately with TRL's harness; extra ``ggpo-train`` flags go after ``--``.

Timing is benchmark-side only: wrappers around the rollout engine, the verifier and the
module's log-prob calls, and Lightning hooks around backward and the optimizer step.
A step is ``on_train_batch_start`` to ``on_train_batch_end`` (it includes the rollout,
which the online data path runs inside the step).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _timed(fn, phase: dict, key_of):
    """``fn`` wrapped so that each call adds its wall time to ``phase[key_of(...)]``."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phase[key_of(*args, **kwargs)] += time.perf_counter() - start

    return wrapper


def _phase_timer(phase: dict, counts: dict, records: list):
    import lightning as L

    class PhaseTimer(L.Callback):
        """Per-step wall time and its split into generate / verify / forwards / backward / optimizer."""

        def on_train_start(self, trainer, pl_module):
            counts["peak_rss_mb_before_train"] = _peak_rss_mb()  # after the held-out evaluation before training
            engine, verifier = pl_module.engine, pl_module.verifier
            engine.generate = _timed(engine.generate, phase, lambda *a, **k: "generate")
            verifier.score_batch = _timed(verifier.score_batch, phase, lambda *a, **k: "verify")
            # learner forward (grad on) vs reference forward (no grad)
            pl_module._token_logprobs = _timed(pl_module._token_logprobs, phase, lambda *a, **k: (
                "learner_forward" if torch.is_grad_enabled() else "reference_forward"))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            phase.clear()
            self.t0, self.cpu0 = time.perf_counter(), time.process_time()
            self.samples0, self.tokens0 = pl_module.generated_samples, counts["completion_tokens"]

        def on_before_backward(self, trainer, pl_module, loss):
            self.b0 = time.perf_counter()

        def on_after_backward(self, trainer, pl_module):
            phase["backward"] += time.perf_counter() - self.b0

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.o0 = time.perf_counter()  # gradient clipping and the optimizer update follow

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            wall = time.perf_counter() - self.t0
            phase["optimizer"] += time.perf_counter() - self.o0
            reward = trainer.callback_metrics.get("train/reward")
            records.append({
                "step": trainer.global_step, "wall_s": wall, "cpu_s": time.process_time() - self.cpu0,
                "completions": pl_module.generated_samples - self.samples0,
                "completion_tokens": counts["completion_tokens"] - self.tokens0,
                "prompt_tokens": counts.pop("prompt_tokens_step", 0),
                "mean_reward": float(reward) if reward is not None else None,
                "rss_mb": _rss_mb(), "peak_rss_mb": _peak_rss_mb(),
                **{f"t.{k}": v for k, v in phase.items()},
            })
            known = sum(phase.values())
            records[-1]["t.other"] = wall - known
            print(f"[step {trainer.global_step:3d}] {wall:7.3f}s " + " ".join(
                f"{k}={v:.3f}" for k, v in phase.items()) + f" reward={records[-1]['mean_reward']:.3f}", flush=True)

    return PhaseTimer()


def _linear_decay(module, steps: int) -> None:
    """TRL's default schedule on the module's optimizer: ``lr * max(0, 1 - step / steps)``, per step."""
    configure = module.configure_optimizers

    def with_schedule() -> dict:
        optimizer = configure()
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    module.configure_optimizers = with_schedule


def _count_tokens(module, counts: dict) -> None:
    """Counts generated response tokens and prompt tokens per rollout (wraps ``GGPOModule.rollout``)."""
    rollout = module.group_rollout

    def counted(rows):
        groups = rollout(rows)
        counts["completion_tokens"] += sum(len(r) for g in groups for r in g.response_ids)
        counts["prompt_tokens_step"] += sum(len(g.prompt_ids) * g.k for g in groups)
        return groups

    module.group_rollout = counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="folder made by shared/peer-bench/tiny_setup.py")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="trainer.precision bf16-mixed (default 32-true)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval-n", type=int, default=256, help="greedy accuracy on the first N test prompts")
    parser.add_argument("--out", help="write the result JSON here")
    parser.add_argument("extra", nargs="*", help="more ggpo-train flags (after --)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))  # first_integer.FirstIntegerVerifier

    from ggpo_lightning.cli.train import GGPOTrainCLI, _EXPECTED_WARNINGS
    from ggpo_lightning.training.data import PromptGroupDataModule
    from ggpo_lightning.training.module import GGPOModule
    from ggpo_lightning.cli.train import TRAINER_DEFAULTS
    import warnings

    for pattern in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    art = Path(args.artifacts).resolve()
    run_root = Path(args.out).with_suffix("") if args.out else art / "ggpo_runs"
    cli_args = [
        f"--seed_everything={args.seed}",
        "--trainer.accelerator=cpu", "--trainer.devices=1",
        f"--trainer.precision={'bf16-mixed' if args.bf16 else '32-true'}",
        f"--trainer.max_steps={args.steps}", f"--trainer.val_check_interval={args.steps + 1}",
        "--trainer.gradient_clip_val=1.0", "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={run_root}",
        "--checkpoint.save_last=false", f"--checkpoint.every_n_train_steps={10 * args.steps}",
        "--summary.export=false",
        f"--model.model_name_or_path={art / 'model'}",
        "--model.objective.name=ggpo", "--model.objective.beta=0.04", "--model.ref_refresh_every=0",
        "--model.rollout.k=8", "--model.rollout.sync_every=1",
        "--model.rollout.sampling.temperature=1.0", "--model.rollout.sampling.top_p=1.0",
        "--model.rollout.sampling.max_new_tokens=16", "--model.rollout.sampling.generation_batch_size=64",
        '--model.verifier={"class_path": "first_integer.FirstIntegerVerifier"}',
        "--model.optimizer=torch.optim.AdamW", f"--model.optimizer.lr={args.lr}",
        "--model.optimizer.weight_decay=0.0", "--model.optimizer.fused=true",  # TRL's default: adamw_torch_fused
        f"--data.train_path={art / 'data' / 'train.jsonl'}", f"--data.val_path={art / 'data' / 'test.jsonl'}",
        f"--data.val_size={args.eval_n}", "--data.prompts_per_step=8", "--data.mode=online",
        f"--data.seed={args.seed}", *args.extra,
    ]
    setup_start = time.perf_counter()
    cli = GGPOTrainCLI(GGPOModule, PromptGroupDataModule, run=False, auto_configure_optimizers=False,
                       save_config_kwargs={"overwrite": True}, trainer_defaults=TRAINER_DEFAULTS, args=cli_args)
    phase, counts, records = defaultdict(float), defaultdict(int), []
    _count_tokens(cli.model, counts)
    _linear_decay(cli.model, args.steps)
    cli.trainer.callbacks.append(_phase_timer(phase, counts, records))
    rss_after_load = _rss_mb()
    setup_s = time.perf_counter() - setup_start
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    print("RESULT " + json.dumps(_result(args, cli, records, counts, summary, rss_after_load, setup_s)))


def _result(args, cli, records: list, counts: dict, summary: dict, rss_after_load: float, setup_s: float) -> dict:
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
        "n_params": cli.model.learner.num_parameters(), "steps": args.steps,
        "sec_per_step_median_excl_first": round(median, 4),
        "completions_per_sec_at_median_step": round(64 / median, 2),
        "completions_per_sec": round(comps / wall, 2),
        "completion_tokens_per_sec": round(ctok / wall, 2),
        "total_tokens_per_sec": round((ctok + ptok) / wall, 2),
        "mean_completion_len": round(ctok / max(comps, 1), 3),
        "cpu_util_threads": round(sum(r["cpu_s"] for r in timed) / wall, 3),
        "phase_median_s": {k[2:]: round(statistics.median(r.get(k, 0.0) for r in timed), 4) for k in keys},
        "phase_share_of_step": {k[2:]: round(sum(r.get(k, 0.0) for r in timed) / wall, 4) for k in keys},
        "peak_rss_mb": round(_peak_rss_mb(), 1), "rss_after_load_mb": round(rss_after_load, 1),
        "peak_rss_mb_before_train": round(counts["peak_rss_mb_before_train"], 1),
        "reward_per_step": [round(x, 4) for x in rewards],
        "reward_mean_first10": round(statistics.mean(rewards[:10]), 4),
        "reward_mean_last10": round(statistics.mean(rewards[-10:]), 4),
        "greedy_test_acc_before": summary["accuracy_before"], "greedy_test_acc_after": summary["accuracy_after"],
        "setup_s": round(setup_s, 2), "torch_threads": torch.get_num_threads(),
        "per_step": records,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return {k: v for k, v in result.items() if k != "per_step"}


if __name__ == "__main__":
    main()
