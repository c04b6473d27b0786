"""GGPOModule: the Lightning glue around one training step.

One optimizer step (:meth:`GGPOModule.training_step`) reads top to bottom:

1. the DataModule hands over the step's prompt groups (rolled out by :attr:`rollout`,
   :class:`~ggpo_lightning.rollout.GroupRollout`, when the data is online);
2. :func:`~ggpo_lightning.batch.pack_step` packs them into a typed
   :class:`~ggpo_lightning.batch.StepBatch`;
3. learner log-probs with gradient, reference log-probs without (cached per group until
   the next refresh), as :class:`~ggpo_lightning.objectives.ObjectiveInputs`;
4. the configured objective's loss (the module never names an objective);
5. the step's metrics, reduced over ranks, logged; a non-finite loss skips the step.

After each optimizer update two schedules run (callbacks): the rollout engine gets the
learner's weights every ``rollout.sync_every`` updates (behavior staleness) and the
reference becomes a copy of the learner every ``ref_refresh_every`` updates (a new Gibbs
target, ``docs/METHOD.md#reference-refresh``). The models and their LoRA/FSDP branches
live in :class:`~ggpo_lightning.policy.Policy`; evaluation in
:mod:`ggpo_lightning.evaluation`; the checkpoint schema in :mod:`ggpo_lightning.checkpoint`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor

from ggpo_lightning.buffer import RolloutGroup
from ggpo_lightning.batch import ReferenceLogprobCache, StepBatch, batch_token_logprobs, pack_step
from ggpo_lightning.callbacks import ReferenceRefresh, RolloutSync, StepProgressBar
from ggpo_lightning.checkpoint import (CHECKPOINT_KEY, RunState, current_rank_state, fingerprint_differences,
                                       restore_rank_state, run_fingerprint)
from ggpo_lightning.distributed import all_gather_objects, reduce_step_metrics, sum_across_ranks, world
from ggpo_lightning.drift import behavior_anchor, drift_diagnostics
from ggpo_lightning.evaluation import EvalConfig, accuracy_across_ranks, count_correct, decoding_settings
from ggpo_lightning.export import Writer, export_targets
from ggpo_lightning.health import VerifierHealth, VerifierHealthConfig
from ggpo_lightning.logprobs import supports_packed
from ggpo_lightning.lora import LoraSettings
from ggpo_lightning.models import load_causal_lm, load_tokenizer
from ggpo_lightning.objectives import ObjectiveConfig, ObjectiveInputs, get_objective, ggpo_diagnostics
from ggpo_lightning.policy import Policy
from ggpo_lightning.producer import RolloutProducer, async_run_errors
from ggpo_lightning.records import PromptRow, validate_golds
from ggpo_lightning.rollout import GroupRollout, RolloutConfig, RolloutCounts

__all__ = ["GGPOModule"]

log = logging.getLogger(__name__)


def _default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)


class GGPOModule(L.LightningModule):
    """Off-policy RL fine-tuning of a causal LM with verifiable rewards.

    Args:
        model_name_or_path: local folder or hub id of a transformers causal LM.
        objective: the objective (``name``: ``ggpo``, ``agro``, ``grpo``, ``maxrl`` or a
            registered plugin) and its settings (``beta``, ``clip_eps``, ``kl_estimator``).
        rollout: group size, sampling, sync schedule and precision of the behavior policy.
        eval: held-out accuracy: ``max_new_tokens`` (None = the rollout's),
            ``temperature`` (0 = greedy pass@1), ``batch_size`` (prompts per call).
        verifier: answer checker: a registry name (``math``, ``numeric``, ``exact``, or
            a plugin) or ``{"class_path": ..., "init_args": ...}``.
        verifier_timeout: wall-clock seconds per answer check.
        verifier_health: when a broken verifier aborts the run (failed-check share, patience) and
            when a slow one is warned about (:class:`~ggpo_lightning.health.VerifierHealthConfig`).
        ref_refresh_every: copy the learner into the reference every N optimizer updates
            (0 = never).
        optimizer: optimizer over the learner's parameters only.
        logprob_chunk_size: response tokens per output-head chunk (bounds logits memory).
        shared_prefix: compute learner and reference log-probs on shared-prefix rows (one
            copy of a group's prompt for its K responses, no padding to the longest
            response; :func:`~ggpo_lightning.logprobs.pack_groups`): the same numbers with
            fewer token positions. Needs transformers' ``sdpa`` attention; other attention
            implementations use the padded layout.
        gradient_checkpointing: recompute activations in backward (less memory, more time).
        max_nan_steps: stop after this many non-finite losses in a row.
        chat_template: wrap each prompt as a user turn with the tokenizer's chat template
            (instruction-tuned models); False = the prompt text as it is (base models).
        lora: train a LoRA adapter on the frozen base instead of all weights (needs
            ``peft``; see :mod:`ggpo_lightning.lora`).
    """

    resume_mismatch_ok = False
    """Resume a checkpoint whose fingerprint differs from this run's (``--resume_mismatch_ok true``), with a warning."""

    def __init__(
        self,
        model_name_or_path: str,
        objective: ObjectiveConfig | None = None,
        rollout: RolloutConfig | None = None,
        eval: EvalConfig | None = None,
        verifier: str | dict = "math",
        verifier_timeout: float = 5.0,
        verifier_health: VerifierHealthConfig | None = None,
        ref_refresh_every: int = 160,
        optimizer: OptimizerCallable = _default_optimizer,
        logprob_chunk_size: int = 4096,
        shared_prefix: bool = True,
        gradient_checkpointing: bool = False,
        max_nan_steps: int = 10,
        chat_template: bool = False,
        lora: LoraSettings | None = None,
    ) -> None:
        super().__init__()
        self.objective_config = objective or ObjectiveConfig()
        self.rollout_config = rollout or RolloutConfig()
        self.eval_config = eval or EvalConfig()
        self.verifier_health = VerifierHealth(verifier_health or VerifierHealthConfig())
        _check_settings(self.objective_config, self.rollout_config, self.eval_config, verifier, verifier_timeout,
                        self.verifier_health.config, ref_refresh_every, max_nan_steps, lora)
        self.objective = get_objective(self.objective_config.name)
        self.verifier_spec, self.verifier_timeout = verifier, verifier_timeout
        self.ref_refresh_every = ref_refresh_every
        self.optimizer_factory = optimizer
        self.logprob_chunk_size = logprob_chunk_size
        self.max_nan_steps = max_nan_steps
        self.model_name_or_path = model_name_or_path
        self.tokenizer = load_tokenizer(model_name_or_path)
        if chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"model.chat_template is true but the tokenizer of {model_name_or_path} has no chat "
                             "template; set model.chat_template: false or use an instruction-tuned model")
        model = load_causal_lm(model_name_or_path, dtype=torch.float32).train()
        self.shared_prefix = shared_prefix and supports_packed(model)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # behavior log-probs recorded with every group: GRPO's ratios and every objective's drift diagnostics
        self.policy = Policy(model, self.tokenizer, lora, self.rollout_config, model_name_or_path,
                             record_logprobs=True)
        self.anchor_weight = self.objective_config.anchor_weight(self.rollout_config.max_lag)
        self.learner, self.reference = self.policy.learner, self.policy.reference  # registered: checkpoint keys
        self.rollout = GroupRollout(self.policy.engine, self.tokenizer, self.rollout_config, chat_template)
        self.reference_cache = ReferenceLogprobCache()
        self.producer: RolloutProducer | None = None  # async mode: made in setup, with the DataModule's prompts
        self.nan_steps, self._nan_streak = 0, 0
        self._resync_engine = False  # set by a checkpoint that left the engine's weights to the learner's

    @property
    def engine(self):
        """The rollout engine (the behavior policy)."""
        return self.policy.engine

    @property
    def generated_samples(self) -> int:
        """Responses generated by this process so far (the x-axis of sample efficiency)."""
        return self.rollout.generated_samples

    @generated_samples.setter
    def generated_samples(self, count: int) -> None:
        self.rollout.generated_samples = count

    @property
    def verifier(self):
        """The answer checker (a worker pool, started in ``setup``)."""
        return self.rollout.verifier

    @verifier.setter
    def verifier(self, verifier) -> None:
        self.rollout.verifier = verifier

    # ------------------------------------------------------------------ set-up

    def setup(self, stage: str) -> None:
        from ggpo_verifiers import get_verifier

        if self.rollout.verifier is None:
            self.rollout.verifier = get_verifier(self.verifier_spec, timeout=self.verifier_timeout)
        self.engine.to(self.device)
        rank, _ = world()
        if rank > 0 and stage == "fit":
            # every rank starts from the same seed: give each other rank its own sampling stream
            # (rank 0 keeps the stream a single process would have)
            torch.manual_seed(torch.initial_seed() + 1_000_003 * rank)
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            validate_golds(datamodule.train_rows + datamodule.val_rows, self.rollout.verifier)
            if self.rollout_config.mode == "async" and stage == "fit" and self.producer is None:
                self.producer = self._make_producer(datamodule)
            datamodule.connect_rollout(self.rollout, self.producer)

    def _make_producer(self, datamodule) -> RolloutProducer:
        errors = async_run_errors(datamodule.mode, world()[1])
        if errors:
            raise ValueError("; ".join(errors))
        return RolloutProducer(self.rollout, self.engine, datamodule.step_prompts, self.rollout_config.staleness_bound,
                               take_counts=self.rollout.take_counts)

    def on_train_end(self) -> None:
        if self.producer is not None:  # before the final evaluation: it would compete for the cores
            self.producer.stop()

    def teardown(self, stage: str) -> None:
        if self.producer is not None:
            self.producer.stop()
        if hasattr(self.engine, "close"):  # a child generation process (async mode)
            self.engine.close()
        if self.rollout.verifier is not None:
            self.rollout.verifier.close()
            self.rollout.verifier = None

    def train(self, mode: bool = True) -> GGPOModule:
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()  # frozen: no dropout, whatever Lightning toggles
        return self

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``: shard learner and reference with FSDP2 (:meth:`Policy.shard`)."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if self._trainer is None or not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        self.policy.shard(self.device_mesh, bf16_mixed=str(self.trainer.precision) == "bf16-mixed")
        self.engine.to(self.device)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(self.policy.trainable_parameters())

    def configure_callbacks(self) -> list[L.Callback]:
        # Callbacks, not module hooks: Lightning runs checkpoint callbacks last, so a checkpoint
        # taken at step s already holds the engine and reference as updated at step s.
        schedules: list[L.Callback] = [RolloutSync(self.rollout_config.sync_every)]
        if self.ref_refresh_every:
            schedules.append(ReferenceRefresh(self.ref_refresh_every))
        if type(self.trainer.progress_bar_callback) is RichProgressBar:  # Lightning's default bar: replaced
            schedules.append(StepProgressBar())
        return schedules

    # ------------------------------------------------------------------ the training step

    def training_step(self, dataloader_iter: Iterator) -> dict[str, Any] | None:
        # Taking the iterator (not a batch) stops Lightning from prefetching the next batch,
        # which would roll it out *before* this step's update and sync: one step staler than configured.
        groups, _, _ = next(dataloader_iter)
        start = time.perf_counter()
        batch = self.pack(groups)
        loss, inputs = self.step_loss(batch)
        metrics = self._step_metrics(batch, inputs, loss)
        if not torch.isfinite(metrics["loss"]):  # the mean over ranks: every rank skips the same steps
            return self._skip_nan_step()
        self._nan_streak = 0
        self.log("train/loss", metrics.pop("loss"), prog_bar=True, batch_size=len(groups))
        self.log("train/reward", metrics.pop("reward"), prog_bar=True, batch_size=len(groups))
        self.log("train/staleness", metrics.pop("staleness"), prog_bar=True, batch_size=len(groups))
        # a NaN here means "no such responses in this step" (e.g. logratio_correct without a correct one): left out
        self.log_dict({f"train/{k}": v for k, v in metrics.items() if not torch.isnan(v)}, batch_size=len(groups))
        # the step's clock and token count go to on_train_batch_end, which runs after the update
        return {"loss": loss, "train_start": start, "train_tokens": batch.tokens}

    def pack(self, groups: list[RolloutGroup]) -> StepBatch:
        """The step's groups as tensors on this device (with what the objective needs)."""
        return pack_step(groups, self.tokenizer.pad_token_id, self.device, self.shared_prefix,
                         require_behavior_logp=self.objective.uses_behavior_logp)

    def step_loss(self, batch: StepBatch) -> tuple[Tensor, ObjectiveInputs]:
        """The objective's loss on ``batch``, plus ``lambda`` times the behavior anchor when it is on
        (``docs/METHOD.md#the-behavior-anchor``), and the inputs it was computed from."""
        inputs = self.objective_inputs(batch)
        loss = self.objective.loss(inputs, self.objective_config)
        if self.anchor_weight:
            loss = loss + self.anchor_weight * behavior_anchor(inputs.logp, inputs.mask)
        return loss, inputs

    def reference_token_logprobs(self, batch: StepBatch) -> Tensor:
        """Reference token log-probs ``[B, L]`` of the batch (no grad; cached per group until the next refresh)."""
        with self.policy.reference_model() as reference:
            return self.reference_cache.token_logprobs(reference, batch, self.tokenizer.pad_token_id,
                                                       self.logprob_chunk_size)

    def objective_inputs(self, batch: StepBatch) -> ObjectiveInputs:
        """Learner log-probs (with gradient) and reference log-probs (without) of the batch, laid out ``[G, K]``
        (and ``[G, K, T]`` for token-level objectives)."""
        token_logp = batch_token_logprobs(self.learner, batch, self.logprob_chunk_size)  # [B, L]
        ref_token_logp = self.reference_token_logprobs(batch)  # [B, L]
        behavior = batch.behavior_token_logp  # [B, L] or None
        inputs = ObjectiveInputs(logp=batch.to_groups(token_logp.sum(-1)), rewards=batch.rewards,  # [G, K]
                                 mask=batch.group_mask, ref_logp=batch.to_groups(ref_token_logp.sum(-1)),
                                 behavior_logp=None if behavior is None else batch.to_groups(behavior.sum(-1)))
        if self.objective.level != "token":
            return inputs
        return replace(inputs, token_logp=batch.to_groups(token_logp), token_mask=batch.to_groups(batch.target_mask),
                       ref_token_logp=batch.to_groups(ref_token_logp),  # [G, K, L]
                       behavior_token_logp=None if behavior is None else batch.to_groups(behavior))

    def _step_metrics(self, batch: StepBatch, inputs: ObjectiveInputs, loss: Tensor) -> dict[str, Tensor]:
        """The step's metrics (``docs/METHOD.md#diagnostics``), reduced over ranks. Drift diagnostics need
        the groups' recorded behavior log-probs (absent only for buffer files written without them)."""
        mask, rewards = inputs.mask, inputs.rewards  # [G, K]
        n = mask.sum().clamp(min=1)
        logp = inputs.logp.detach()  # [G, K]
        counts = self._rollout_counts()
        verifier_stats = counts.verifier.as_dict(prefix="verifier/")
        staleness = (self.global_step - batch.versions).float()
        metrics = {
            "loss": loss.detach(),
            **ggpo_diagnostics(logp, inputs.ref_logp, rewards, self.objective_config.beta, mask),
            "behavior_anchor": behavior_anchor(logp, mask),  # the anchor term itself, whether on or off
            "reward": (rewards * mask).sum() / n,
            "accuracy": ((rewards == 1) & mask).sum() / n,
            "staleness": staleness.mean(),
            "staleness_max": staleness.max(),
            "rollout_seconds": torch.tensor(counts.seconds),
            "rollout_tokens_per_s": torch.tensor(counts.tokens / max(counts.seconds, 1e-9)),
            "generated_samples": torch.tensor(float(self.generated_samples)),  # cumulative: x-axis of efficiency
            **{k: torch.tensor(float(v)) for k, v in verifier_stats.items()},
            **self._async_metrics(),
        }
        if inputs.behavior_logp is not None:
            metrics.update(drift_diagnostics(logp, inputs.behavior_logp, inputs.ref_logp, rewards, mask).as_dict())
        metrics = reduce_step_metrics(metrics, self.device)
        # the same counts (reduced) on every rank: every rank aborts at the same step, or none does
        self.verifier_health.check_step({k.removeprefix("verifier/"): float(metrics[k]) for k in verifier_stats},
                                        self.global_step, counts.verify_seconds)
        return metrics

    def _rollout_counts(self) -> RolloutCounts:
        """This step's rollout counts: the rollout's own (sync), or those of the batch taken from the producer
        (async; a batch restored from a checkpoint counted nothing in this run)."""
        if self.producer is None:
            return self.rollout.take_counts()
        return self.producer.last_taken.counts or RolloutCounts()

    def _async_metrics(self) -> dict[str, Tensor]:
        """Async mode: how long the step waited for its batch, the producer's queue and the groups used past
        ``max_staleness`` (:mod:`~ggpo_lightning.producer`)."""
        if self.producer is None:
            return {}
        taken = self.producer.last_taken
        return {"rollout_wait_seconds": torch.tensor(taken.wait_seconds),
                "over_staleness": torch.tensor(float(taken.over_staleness)),
                "async_queue": torch.tensor(float(len(self.producer.backlog()[0])))}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Here the backward pass and the optimizer update are done: the step's full training time.
        if not outputs:  # a skipped step
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - outputs["train_start"]
        self.log_dict({"train/train_seconds": seconds,
                       "train/train_tokens_per_s": outputs["train_tokens"] / max(seconds, 1e-9)}, batch_size=1)

    def _skip_nan_step(self) -> None:
        self.nan_steps += 1
        self._nan_streak += 1
        self.log("train/nan_steps", float(self.nan_steps), batch_size=1)
        log.warning("non-finite loss at step %d: skipped (%d in a row, %d in all)",
                    self.global_step, self._nan_streak, self.nan_steps)
        if self._nan_streak >= self.max_nan_steps:
            path = Path(self.trainer.log_dir or self.trainer.default_root_dir) / "nan-stop.ckpt"
            self.trainer.save_checkpoint(path)
            self.trainer.should_stop = True
            log.error("%d non-finite losses in a row: stopping; checkpoint saved to %s. Lower the learning "
                      "rate or check the data and precision settings.", self._nan_streak, path)
        return None

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The update, then the gradients freed (``set_to_none``) at once rather than when the next backward
        starts: the next rollout and forward run without a model-sized gradient buffer (lower peak memory)."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping; under bf16 mixed precision also with a fused optimizer (``fused=True``).

        Lightning refuses to clip for optimizers that unscale gradients themselves whenever
        mixed precision is on, because fp16's loss scaler would have it clip scaled
        gradients. bf16 has no scaler: the gradients are the true ones, clipped here directly.
        """
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        if not (gradient_clip_val and fused and getattr(self.trainer.precision_plugin, "scaler", None) is None):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    # ------------------------------------------------------------------ schedules (called by the callbacks)

    def sync_rollout_engine(self) -> None:
        """The learner's weights into the rollout engine, tagged with the current step (:meth:`Policy.sync_engine`);
        in async mode, once the producer runs, a copy handed over for it to load at its next batch boundary."""
        if self.producer is not None and self.producer.started:
            self.producer.publish(self.policy.engine_weights_copy(), version=self.global_step)
        else:
            self.policy.sync_engine(version=self.global_step)

    def refresh_reference(self) -> None:
        """The reference becomes the learner (:meth:`Policy.refresh_reference`); cached reference log-probs go."""
        self.reference_cache.clear()
        self.policy.refresh_reference(self.trainer.optimizers if self._trainer is not None else [])

    # ------------------------------------------------------------------ evaluation and export

    def evaluate(self, rows: list[PromptRow]) -> float:
        """Held-out accuracy of the learner on ``rows``: greedy pass@1, or one sample per prompt at
        ``eval.temperature`` from a fixed-seed forked RNG (validation never shifts the rollouts that follow).
        On several processes every rank must call it (:func:`~ggpo_lightning.evaluation.count_correct`)."""
        if not rows:
            raise ValueError("evaluate() needs at least one prompt")
        config, sampling = self.eval_config, self.rollout_config.sampling
        # async: the producer waits meanwhile (the same global RNG, seeded here, and the same verifier pool)
        with self.producer.paused() if self.producer is not None else contextlib.nullcontext():
            self.rollout.verifier.reset_stats()
            correct = count_correct(self.learner, self.tokenizer, [self.rollout.encode(r.prompt) for r in rows],
                                    [r.gold for r in rows], self.rollout.verifier, 1,
                                    decoding_settings(config.temperature, sampling.top_p),
                                    config.max_new_tokens or sampling.max_new_tokens, config.batch_size, seed=0)
            stats = self.rollout.verifier.reset_stats()
        counts = sum_across_ranks(torch.tensor([stats.crashed, stats.timeout, stats.total], dtype=torch.float64,
                                               device=self.device)).tolist()
        self.verifier_health.check_evaluation(dict(zip(("crashed", "timeout", "total"), counts)),
                                              f"held-out evaluation at step {self.global_step}")
        return accuracy_across_ranks(correct, 1, len(rows), self.device)

    def validation_step(self, rows: list[PromptRow], batch_idx: int) -> None:
        # already over all ranks; sync_dist only tells Lightning so (a mean of equal values)
        self.log("val/accuracy", self.evaluate(rows), prog_bar=True, batch_size=len(rows), sync_dist=True)

    def exports(self, run_dir: Path) -> dict[Path, Writer]:
        """The final export's folders and their writers (:func:`~ggpo_lightning.export.export_targets`)."""
        return export_targets(self.policy, self.tokenizer, self.model_name_or_path, run_dir)

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Called on every rank; Lightning writes rank 0's dict, so the per-rank state is gathered into it.
        ranks = all_gather_objects(current_rank_state(self.generated_samples))
        if self.producer is not None:  # the newest weights handed over, read safely against the producer's loads
            version, state = self.producer.engine_checkpoint(self.global_step, self.policy.engine_state_to_save)
        else:
            version, state = self.engine.version, self.policy.engine_state_to_save(self.global_step)
        checkpoint[CHECKPOINT_KEY] = RunState(self.model_name_or_path, version, state, self.nan_steps, ranks,
                                              self.policy.lora_state(), self.run_fingerprint()).to_dict()

    def run_fingerprint(self) -> dict[str, Any]:
        """What a resume must match (:func:`~ggpo_lightning.checkpoint.run_fingerprint`): the settings that define
        the run and, with a DataModule attached, the training data's fingerprint."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        objective, rollout = self.objective_config, self.rollout_config
        settings = {"model.objective.name": objective.name, "model.objective.beta": objective.beta,
                    "model.rollout.k": rollout.k, "model.rollout.sync_every": rollout.sync_every,
                    "model.model_name_or_path": self.model_name_or_path,
                    "data.prompts_per_step": getattr(datamodule, "prompts_per_step", None)}
        return run_fingerprint(settings, datamodule.fingerprint() if datamodule is not None else None)

    def check_resume(self, state: RunState) -> None:
        """The checkpoint's fingerprint against this run's: differences are a ValueError naming them, unless
        :attr:`resume_mismatch_ok` (``--resume_mismatch_ok true``), then a warning."""
        if state.fingerprint is None:
            log.warning("the checkpoint predates run fingerprints (schema %d): resuming without checking that the "
                        "settings and training data are the ones it was trained with", state.schema)
            return
        differences = fingerprint_differences(state.fingerprint, self.run_fingerprint())
        if not differences:
            return
        listed = "\n  ".join(differences)
        if not self.resume_mismatch_ok:
            raise ValueError(f"the checkpoint was written by a different run:\n  {listed}\nresume with the settings "
                             "and data it was trained with, or pass --resume_mismatch_ok true to continue anyway")
        log.warning("resuming a checkpoint of a different run (--resume_mismatch_ok):\n  %s", listed)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = RunState.from_dict(checkpoint[CHECKPOINT_KEY])
        # the specific LoRA/base check first: its message says which model to load
        self.policy.check_resumable(state, self.model_name_or_path)
        self.check_resume(state)
        self._resync_engine = self.policy.restore_engine(state.engine_state, state.engine_version)
        self.nan_steps = state.nan_steps
        self.generated_samples = restore_rank_state(state.ranks)
        if state.lora is not None:
            self.policy.lora_merges = state.lora.merges

    def on_train_start(self) -> None:
        if self._resync_engine:
            self.sync_rollout_engine()  # at the restored step: the checkpoint's engine_version
            self._resync_engine = False


def _check_settings(objective: ObjectiveConfig, rollout: RolloutConfig, evaluation: EvalConfig,
                    verifier: str | dict, verifier_timeout: float, health: VerifierHealthConfig,
                    ref_refresh_every: int, max_nan_steps: int, lora: LoraSettings | None) -> None:
    """All configuration errors at once, before any model is loaded."""
    from ggpo_verifiers import verifier_class

    errors = objective.errors() + rollout.errors() + evaluation.errors() + (lora.errors() if lora else [])
    errors += health.errors()
    name = verifier if isinstance(verifier, str) else verifier.get("class_path") if isinstance(verifier, dict) else None
    if name is not None:
        try:  # a registered name, an entry point or a class path, as get_verifier accepts
            verifier_class(name)
        except (ImportError, AttributeError, TypeError, ValueError, LookupError) as exc:
            errors.append(f"model.verifier: {exc}")
    if not verifier_timeout > 0:
        errors.append(f"model.verifier_timeout must be > 0 seconds, got {verifier_timeout}")
    if ref_refresh_every < 0:
        errors.append(f"model.ref_refresh_every must be >= 0 (0 = never), got {ref_refresh_every}")
    if max_nan_steps < 1:
        errors.append(f"model.max_nan_steps must be >= 1, got {max_nan_steps}")
    if errors:
        raise ValueError("invalid configuration:\n  " + "\n  ".join(errors))
