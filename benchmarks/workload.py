"""The workload that ``benchmarks/vs_trl.py`` gives both trainers, and what their two workers share.

One optimizer step: 8 prompts (``"17+25="``) x K=8 sampled responses, temperature 1, top-p 1,
at most 16 new tokens, binary reward "the first integer of the response equals the gold"
(``first_integer.py``), KL coefficient beta 0.04 against a frozen reference, AdamW at
``--lr`` (1e-4) without weight decay, fused, decayed linearly to 0 over the run,
gradient-norm clip 1.0, one torch thread. ``ggpo_worker.py`` runs it through ``ggpo-train``,
``trl_worker.py`` through TRL's ``GRPOTrainer``.

The model folders and data are built here with the package's own tiny-model code
(``ggpo_lightning.tasks``), offline, once per folder: ``tiny`` (1.05M parameters, 1500
supervised warm-up steps) and ``m30`` (33.6M, 150 steps at 1e-3), both Llama-architecture
with the 40-token word-level vocabulary, and 4096 training and 512 held-out sums of two
operands up to 99. Layout: ``ROOT/NAME/model`` (weights and tokenizer) and
``ROOT/NAME/data/{train,test}.jsonl`` (``{"id", "prompt", "answer"}`` rows).

Both workers record one dict per step (``wall_s``, ``cpu_s``, ``completions``,
``completion_tokens``, ``prompt_tokens``, ``mean_reward`` and a ``t.PHASE`` time per phase of
:data:`PHASES`) and report them through :func:`step_summary`, so the two results compare
key by key.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PROMPTS_PER_STEP, K, MAX_NEW_TOKENS = 8, 8, 16
TEMPERATURE, BETA, MAX_GRAD_NORM = 1.0, 0.04, 1.0
PHASES = ("generate", "verify", "learner_forward", "reference_forward", "backward", "optimizer")
"""The split of a step, in both workers: ``generate`` (the rollout less the verifier: prompt encoding, sampling,
decoding, building the groups), ``verify``, ``reference_forward`` (the frozen reference's forward),
``backward``, ``optimizer`` (clipping and the update), ``learner_forward`` (the rest of the step: the learner's
forward with gradient, packing, the loss)."""
MODELS = {  # name -> TinyModelConfig fields (the rest at their defaults: 128 positions, label noise 0.3, seed 0)
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "sft_steps": 1500, "sft_lr": 3e-3},
    "m30": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "sft_steps": 150, "sft_lr": 1e-3},
}
N_TRAIN, N_TEST = 4096, 512


def build_artifacts(root: Path, name: str, sft_steps: int | None = None) -> Path:
    """``root / name`` with the model folder and data of :data:`MODELS` ``[name]``, built on first use.

    ``sft_steps`` overrides the warm-up length (0: random weights, for smoke runs). A folder built with other
    settings is refused (``SettingsError`` naming them), never silently reused. Built on one torch thread, so that
    the weights do not depend on the machine's core count."""
    import torch

    from ggpo_lightning.tasks import ArithmeticTask, write_splits
    from ggpo_lightning.tasks.tiny_model import TinyModelConfig, ensure_tiny_model

    fields = MODELS[name] if sft_steps is None else {**MODELS[name], "sft_steps": sft_steps}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ensure_tiny_model(root / name / "model", TinyModelConfig(**fields))
    finally:
        torch.set_num_threads(threads)
    write_splits(ArithmeticTask(), root / name / "data", n_train=N_TRAIN, n_test=N_TEST, seed=0)
    return root / name


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def rss_mb() -> float:
    """The process's resident memory now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def time_forwards(model: torch.nn.Module, phase: dict[str, float], name: str) -> None:
    """Forward hooks on ``model``'s children adding each call's wall time to ``phase[name]`` (a causal LM's
    children are its decoder body and its output head, which log-prob code may call apart)."""
    started: dict[int, float] = {}

    def before(module: torch.nn.Module, args: tuple) -> None:
        started[id(module)] = time.perf_counter()

    def after(module: torch.nn.Module, args: tuple, output: object) -> None:
        phase[name] += time.perf_counter() - started.pop(id(module))

    for child in model.children():
        child.register_forward_pre_hook(before)
        child.register_forward_hook(after)


def worker_parser(description: str) -> argparse.ArgumentParser:
    """The command line both workers take: the artifacts, the run's length and precision, the learning rate."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, required=True, help="a folder made by build_artifacts")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (default fp32)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval-n", type=int, default=256, help="greedy accuracy on the first N test prompts")
    parser.add_argument("--out", type=Path, help="write the result JSON here")
    return parser


def step_summary(records: list[dict]) -> dict:
    """Throughput, time split and reward curve of a run's step records; step 1 (warm-up) left out of the times."""
    timed = records[1:] or records
    wall = sum(r["wall_s"] for r in timed)
    completions = sum(r["completions"] for r in timed)
    completion_tokens = sum(r["completion_tokens"] for r in timed)
    tokens = completion_tokens + sum(r["prompt_tokens"] for r in timed)
    rewards = [r["mean_reward"] for r in records]
    return {
        "sec_per_step_median_excl_first": round(statistics.median(r["wall_s"] for r in timed), 4),
        "completions_per_sec": round(completions / wall, 2),
        "completion_tokens_per_sec": round(completion_tokens / wall, 2),
        "total_tokens_per_sec": round(tokens / wall, 2),
        "mean_completion_len": round(completion_tokens / max(completions, 1), 3),
        "cpu_util_threads": round(sum(r["cpu_s"] for r in timed) / wall, 3),  # below the threads: waiting on others
        "phase_median_s": {p: round(statistics.median(r.get(f"t.{p}", 0.0) for r in timed), 4) for p in PHASES},
        "phase_share_of_step": {p: round(sum(r.get(f"t.{p}", 0.0) for r in timed) / wall, 4) for p in PHASES},
        "reward_per_step": [round(x, 4) for x in rewards],
        "reward_mean_first10": round(statistics.mean(rewards[:10]), 4),
        "reward_mean_last10": round(statistics.mean(rewards[-10:]), 4),
        "train_wall_s": round(sum(r["wall_s"] for r in records), 3),
    }


def report(result: dict, records: list[dict], out: Path | None) -> None:
    """Write ``result`` with the per-step records to ``out`` (if given); print it without them as ``RESULT {...}``."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**result, "per_step": records}, indent=2))
    print("RESULT " + json.dumps(result), flush=True)

