"""One timed run of TRL's ``GRPOTrainer`` on a benchmark folder (``workload.build_artifacts``); prints ``RESULT {...}``
with the figures ``ggpo_worker.py`` prints for ours, under the same keys.

    .venv/bin/pip install -e ".[bench]"        # TRL (pinned), for the benchmarks only
    .venv/bin/python benchmarks/trl_worker.py --artifacts runs/bench/m30 --steps 40 --threads 1 [--bf16]

The workload is ``workload.py``'s, set through ``GRPOConfig``: a batch of 8 x 8 completions
per optimizer step (TRL counts its batch in completions), one generation per step and one
update per generation (so no old-policy forward), ``beta`` 0.04 (TRL loads a frozen reference
from the model folder), sampling on the trainer's own model with ``model.generate``. TRL's
defaults kept: loss ``dapo``, AdamW fused, learning rate decayed linearly to 0, clipping at
1.0, no weight decay, shuffled prompts. TRL's defaults changed: bf16 and gradient
checkpointing are on in TRL 1.16; here bf16 only with ``--bf16`` (as ``ggpo-train``'s
``bf16-mixed``) and no checkpointing (the models are small; ours does none either). The
reward is ``first_integer.FirstIntegerVerifier``'s, the verifier ``ggpo-train`` is given.

The time split (``workload.PHASES``): a step is ``on_step_begin`` to ``on_step_end`` of a
trainer callback; ``verify`` is the time inside the reward function; ``reference_forward``
comes from forward hooks on the reference model's children; ``generate`` is TRL's
generate-and-score stage (prompt encoding, sampling, decoding, advantages) less those two
(they run inside it); ``backward`` is the accelerator's ``backward``; ``optimizer`` runs from
the end of backward to the step's end (clipping, the update, the schedule); ``learner_forward``
is the rest: the learner's forward with gradient and the loss. One method of TRL is
overridden for this, ``_generate_and_score_completions`` (not public: the ``bench`` extra pins
TRL's release).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

sys.path.insert(0, str(Path(__file__).parent))  # first_integer and workload: the scripts beside this one

from first_integer import FirstIntegerVerifier
from workload import (BETA, K, MAX_NEW_TOKENS, PROMPTS_PER_STEP, TEMPERATURE, peak_rss_mb, report, rss_mb,
                      step_summary, time_forwards, worker_parser)


class StepClock:
    """The current step's phase times and counts, and one record per finished step (``workload.py``'s shape)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.phase: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self.backward_end = 0.0  # when the step's backward returned

    def begin(self) -> None:
        self.phase.clear()
        self.counts.clear()
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def end(self, step: int) -> None:
        wall = time.perf_counter() - self.t0
        phase, counts = self.phase, self.counts
        phase["optimizer"] = time.perf_counter() - self.backward_end
        phase["generate"] = phase.pop("generate_and_score") - phase["verify"] - phase["reference_forward"]
        phase["learner_forward"] = wall - sum(v for k, v in phase.items() if k != "learner_forward")
        self.records.append({
            "step": step, "wall_s": wall, "cpu_s": time.process_time() - self.cpu0,
            "completions": int(counts["completions"]), "completion_tokens": int(counts["completion_tokens"]),
            "prompt_tokens": int(counts["prompt_tokens"]), "mean_reward": counts["reward"] / counts["completions"],
            "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(), **{f"t.{k}": v for k, v in phase.items()},
        })
        print(f"[step {step:3d}] {wall:7.3f}s " + " ".join(f"{k}={v:.3f}" for k, v in phase.items())
              + f" reward={self.records[-1]['mean_reward']:.3f}", flush=True)


def reward_function(clock: StepClock) -> Callable[..., list[float]]:
    """TRL's reward function: ``FirstIntegerVerifier``'s scores against the data's ``answer`` column, timed."""
    verifier = FirstIntegerVerifier()

    def first_integer(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        start = time.perf_counter()
        scores = verifier.score_batch(completions, answer)
        clock.phase["verify"] += time.perf_counter() - start
        clock.counts["reward"] += sum(scores)
        return scores

    return first_integer


def build_trainer(args: argparse.Namespace, clock: StepClock) -> Any:
    """A ``GRPOTrainer`` on ``args.artifacts`` for the workload, its steps timed into ``clock``."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ggpo_lightning.models.loading import load_tokenizer

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            start = time.perf_counter()
            batch = super()._generate_and_score_completions(inputs)
            clock.phase["generate_and_score"] += time.perf_counter() - start
            clock.counts["completions"] += batch["completion_ids"].shape[0]
            clock.counts["completion_tokens"] += batch["completion_mask"].sum().item()
            clock.counts["prompt_tokens"] += batch["prompt_mask"].sum().item()
            return batch

    class StepCallback(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            clock.begin()

        def on_step_end(self, _: Any, state: Any, *__: Any, **___: Any) -> None:
            clock.end(state.global_step)

    model_dir = str(args.artifacts / "model")
    rows = [json.loads(line) for line in (args.artifacts / "data" / "train.jsonl").read_text().splitlines()]
    config = GRPOConfig(
        output_dir=str(args.out.with_suffix("") if args.out else args.artifacts / "trl_runs"),
        per_device_train_batch_size=PROMPTS_PER_STEP * K, gradient_accumulation_steps=1, num_generations=K,
        max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE, top_p=1.0, beta=BETA,
        learning_rate=args.lr, max_steps=args.steps, seed=args.seed, bf16=args.bf16, activation_checkpointing=False,
        use_cpu=True, use_vllm=False, save_strategy="no", report_to="none", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = TimedGRPOTrainer(model=model_dir, reward_funcs=reward_function(clock), args=config,
                               train_dataset=Dataset.from_list(rows), processing_class=load_tokenizer(model_dir),
                               callbacks=[StepCallback()])
    time_forwards(trainer.ref_model, clock.phase, "reference_forward")
    backward = trainer.accelerator.backward

    def timed_backward(loss: torch.Tensor, **kwargs: Any) -> None:
        start = time.perf_counter()
        backward(loss, **kwargs)
        clock.phase["backward"] += time.perf_counter() - start
        clock.backward_end = time.perf_counter()

    trainer.accelerator.backward = timed_backward
    return trainer


def greedy_test_accuracy(trainer: Any, args: argparse.Namespace) -> float:
    """Greedy accuracy of the policy on the first ``--eval-n`` held-out prompts, scored by the benchmark's reward
    (``ggpo-train`` evaluates the same prompts with the same verifier)."""
    from ggpo_lightning.tasks.tiny_model import greedy_accuracy

    lines = (args.artifacts / "data" / "test.jsonl").read_text().splitlines()[: args.eval_n]
    with FirstIntegerVerifier() as verifier:
        return greedy_accuracy(trainer.model, trainer.processing_class, [json.loads(line) for line in lines],
                               MAX_NEW_TOKENS, verifier=verifier)


def main() -> None:
    args = worker_parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    clock = StepClock()
    trainer = build_trainer(args, clock)
    setup_s, rss_after_load = time.perf_counter() - start, rss_mb()
    accuracy_before = greedy_test_accuracy(trainer, args)
    peak_before_train = peak_rss_mb()
    trainer.train()
    accuracy_after = greedy_test_accuracy(trainer, args)  # before the peak is read, as ggpo-train's is
    result = {
        "system": "trl", "precision": "bf16" if args.bf16 else "fp32", "artifacts": str(args.artifacts),
        "n_params": trainer.model.num_parameters(), "steps": args.steps, **step_summary(clock.records),
        "peak_rss_mb": round(peak_rss_mb(), 1), "rss_after_load_mb": round(rss_after_load, 1),
        "peak_rss_mb_before_train": round(peak_before_train, 1),
        "greedy_test_acc_before": accuracy_before, "greedy_test_acc_after": accuracy_after,
        "setup_s": round(setup_s, 2), "torch_threads": torch.get_num_threads(),
    }
    report(result, clock.records, args.out)


if __name__ == "__main__":
    main()
