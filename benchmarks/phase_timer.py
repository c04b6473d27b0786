"""The benchmark worker's per-step clock, a Lightning callback given to ``ggpo-train`` by class path
(``--trainer.callbacks+={"class_path": "phase_timer.PhaseTimer"}`` with ``benchmarks/`` on the path).

A step is ``on_train_batch_start`` to ``on_train_batch_end`` (the online data path rolls out
inside the step); backward is ``on_before_backward`` to ``on_after_backward`` (summed over
micro-batches); ``optimizer`` runs from ``on_before_optimizer_step`` (clipping included);
``generate`` and ``verify`` come from the step's recorded metrics (``GGPOModule.last_step_metrics``)
``train/rollout_seconds`` and ``train/rollout_verify_seconds`` (with asynchronous rollouts, which overlap the step, ``generate`` is
the learner's wait for a batch, ``train/rollout_wait_seconds``, and ``verify`` 0); ``reference_forward`` from forward hooks on the reference
model's children (the log-prob code calls the decoder body and the output head apart);
``learner_forward`` is the rest of the step: the learner's forward, packing and the loss.
"""

from __future__ import annotations

import time
from collections import defaultdict

import lightning as L
from workload import peak_rss_mb, rss_mb, time_forwards


def _metric(pl_module: L.LightningModule, name: str) -> float:
    return pl_module.last_step_metrics.get(f"train/{name}", 0.0)


class PhaseTimer(L.Callback):
    """Per-step wall time, its split into generate / verify / forwards / backward / optimizer, token counts and
    memory, in :attr:`records` (one dict per step); :attr:`setup` facts (RSS after loading, parameters)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.curve: list[dict] = []  # held-out accuracy at each validation, against the steps' summed wall time
        self.facts: dict = {}
        self.phase: dict[str, float] = defaultdict(float)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        accuracy = trainer.callback_metrics.get("val/accuracy")
        if trainer.state.fn == "fit" and self.records and accuracy is not None:
            self.curve.append({"step": trainer.global_step, "train_seconds": sum(r["wall_s"] for r in self.records),
                               "accuracy": float(accuracy)})

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.facts.update(rss_after_load_mb=rss_mb(), setup_done=time.perf_counter(),
                          n_params=pl_module.learner.num_parameters())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.facts["peak_rss_mb_before_train"] = peak_rss_mb()  # after the held-out evaluation before training
        if pl_module.reference is not None:
            time_forwards(pl_module.reference, self.phase, "reference_forward")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.phase.clear()
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        self.samples0 = pl_module.generated_samples

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.b0 = time.perf_counter()

    def on_after_backward(self, trainer, pl_module) -> None:
        self.phase["backward"] += time.perf_counter() - self.b0  # every micro-batch's backward, when split

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.o0 = time.perf_counter()  # gradient clipping and the optimizer update follow

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        wall = time.perf_counter() - self.t0
        phase = self.phase
        phase["optimizer"] += time.perf_counter() - self.o0
        rollout, verify = _metric(pl_module, "rollout_seconds"), _metric(pl_module, "rollout_verify_seconds")
        if "train/rollout_wait_seconds" in pl_module.last_step_metrics:  # async: the rollout ran beside the step
            rollout, verify = _metric(pl_module, "rollout_wait_seconds"), 0.0
        phase["generate"], phase["verify"] = rollout - verify, verify
        phase["learner_forward"] = wall - sum(v for k, v in phase.items() if k != "learner_forward")
        self.records.append({
            "step": trainer.global_step, "wall_s": wall, "cpu_s": time.process_time() - self.cpu0,
            "completions": pl_module.generated_samples - self.samples0,
            "completion_tokens": int(_metric(pl_module, "response_tokens")),
            "prompt_tokens": int(_metric(pl_module, "rollout_prompt_tokens")),
            "mean_reward": _metric(pl_module, "reward"),
            "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(),
            **{f"t.{k}": v for k, v in phase.items()},
        })
        print(f"[step {trainer.global_step:3d}] {wall:7.3f}s " + " ".join(
            f"{k}={v:.3f}" for k, v in phase.items()) + f" reward={self.records[-1]['mean_reward']:.3f}", flush=True)
