"""GGPOModule: the Lightning glue around one training step.

One optimizer step (:meth:`GGPOModule.training_step`) reads top to bottom:

1. the DataModule hands over the step's prompt groups, drawn from the behavior buffer after the
   :class:`~ggpo_lightning.rollouts.source.RolloutSource` added the fresh ones, with what rolling them out cost;
2. :func:`~ggpo_lightning.core.batch.pack_step` packs them into a typed :class:`~ggpo_lightning.core.batch.StepBatch`;
3. learner log-probs with gradient, reference log-probs without (cached per group until the next refresh), as
   :class:`~ggpo_lightning.core.objectives.ObjectiveInputs`, and the configured objective's loss (the module never
   names an objective), plus the behavior anchor when on (:class:`~ggpo_lightning.core.step_loss.StepLoss`): the
   whole step at once, or micro-batched in one pass or two (:class:`~ggpo_lightning.core.microbatch.StepPasses`);
4. the step's metrics (:func:`~ggpo_lightning.core.metrics.step_metrics` and the rollout's), reduced over ranks,
   recorded (:meth:`~ggpo_lightning.training.hooks.UpdateHooks.record_step_metrics`; written to the loggers after
   the update); a non-finite loss skips the step (the gradients a one-pass step accumulated dropped);
5. the backward of what remains.

After each update two schedules run (callbacks): the rollout source's owner
(:class:`~ggpo_lightning.training.rollout_loop.RolloutLoop`: connection, publishing, checkpoints, closing) publishes
the learner's weights to the engine every ``rollout.sync_every`` updates (staleness), and the reference becomes the
learner every ``ref_refresh_every`` (``docs/METHOD.md#reference-refresh``). The module never asks which engine or
schedule runs (:mod:`ggpo_lightning.rollouts`); models, LoRA and FSDP live in
:class:`~ggpo_lightning.models.policy.Policy`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor

from ggpo_lightning.core.batch import ReferenceLogprobCache, StepBatch, batch_token_logprobs, pack_step
from ggpo_lightning.core.distributed import reduce_step_metrics, world
from ggpo_lightning.core.logprobs import attention_pair_cost, supports_packed
from ggpo_lightning.core.metrics import coverage_metrics, step_metrics
from ggpo_lightning.core.microbatch import MicroBatchConfig, StepPasses, micro_batched_forward
from ggpo_lightning.core.objectives import ObjectiveConfig, ObjectiveInputs, get_objective
from ggpo_lightning.core.schedule import LRScheduleConfig
from ggpo_lightning.core.step_loss import StepLoss
from ggpo_lightning.evaluation.accuracy import EvalConfig, heldout_accuracy
from ggpo_lightning.models.export import Writer, export_targets
from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.models.lora import LoraSettings
from ggpo_lightning.models.policy import Policy
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.records.prompts import PromptRow, validate_golds
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine
from ggpo_lightning.rollouts.factory import make_engine
from ggpo_lightning.rollouts.group import ChatTemplate, GroupRollout
from ggpo_lightning.training.verifier_health import VerifierHealth, VerifierHealthConfig
from ggpo_lightning.rollouts.source import RolloutBatch
from ggpo_lightning.training.callbacks import ReferenceRefresh, StepProgressBar
from ggpo_lightning.training.checkpoint_hooks import CheckpointHooks
from ggpo_lightning.training.data import TrainingBatch
from ggpo_lightning.training.hooks import NanGuard, UpdateHooks
from ggpo_lightning.training.rollout_loop import RolloutLoop
from ggpo_lightning.training.settings import check_settings

__all__ = ["GGPOModule"]

log = logging.getLogger(__name__)


def _default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)


class GGPOModule(CheckpointHooks, UpdateHooks):
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
            when a slow one is warned about (:class:`~ggpo_lightning.training.verifier_health.VerifierHealthConfig`).
        ref_refresh_every: copy the learner into the reference every N optimizer updates
            (0 = never).
        optimizer: optimizer over the learner's parameters only (default: AdamW, lr 1e-6, no weight decay).
        logprob_chunk_size: response tokens per output-head chunk (bounds logits memory).
        shared_prefix: learner and reference log-probs on shared-prefix rows (a group's prompt once for its K
            responses; :func:`~ggpo_lightning.core.logprobs.pack_groups`), the same numbers, on the steps where
            they cost less than the padded rows (:func:`~ggpo_lightning.core.logprobs.layout_cost`). Needs
            transformers' ``sdpa`` attention; other attention implementations use the padded layout.
        gradient_checkpointing: recompute activations in backward (less memory, more time).
        max_nan_steps: stop after this many non-finite losses in a row.
        chat_template: wrap each prompt as a user turn with the tokenizer's chat template
            (instruction-tuned models): true, or settings with a system prompt and template arguments
            (:class:`~ggpo_lightning.rollouts.group.ChatTemplate`); False = the prompt text as it is (base models).
        lora: train a LoRA adapter on the frozen base instead of all weights (needs
            ``peft``; see :mod:`ggpo_lightning.models.lora`).
        micro_batch: ``max_tokens``: padded tokens per micro-batch (activation memory bounded by it, gradients
            exact: :mod:`ggpo_lightning.core.microbatch`); None = the whole step in one pass.
        lr_scheduler: warmup and constant / linear / cosine decay of the optimizer's learning rate
            (:mod:`ggpo_lightning.core.schedule`); None = constant, no scheduler.
        compile: the learner's and reference's log-prob forwards compiled (:mod:`ggpo_lightning.models.compiled`).
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
        chat_template: bool | ChatTemplate = False,
        lora: LoraSettings | None = None,
        micro_batch: MicroBatchConfig | None = None,
        lr_scheduler: LRScheduleConfig | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.objective_config = objective or ObjectiveConfig()
        self.rollout_config = rollout or RolloutConfig()
        self.eval_config = eval or EvalConfig()
        self.micro_batch, self.lr_schedule = micro_batch or MicroBatchConfig(), lr_scheduler
        self.passes = StepPasses(self.micro_batch.max_tokens, logprob_chunk_size)
        self.verifier_health = VerifierHealth(verifier_health or VerifierHealthConfig())
        check_settings(self.objective_config, self.rollout_config, self.eval_config, verifier, verifier_timeout,
                       self.verifier_health.config, ref_refresh_every, max_nan_steps, lora, self.micro_batch,
                       lr_scheduler, compile)
        self.objective = get_objective(self.objective_config.name)
        self.verifier_spec, self.verifier_timeout = verifier, verifier_timeout
        self.ref_refresh_every, self.optimizer_factory = ref_refresh_every, optimizer
        self.logprob_chunk_size = logprob_chunk_size
        self.model_name_or_path = model_name_or_path
        self.tokenizer = load_tokenizer(model_name_or_path)
        if chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise SettingsError(f"model.chat_template is true but the tokenizer of {model_name_or_path} has no chat "
                             "template; set model.chat_template: false or use an instruction-tuned model")
        model = load_causal_lm(model_name_or_path, dtype=torch.float32).train()
        self.shared_prefix = shared_prefix and supports_packed(model)
        self.attention_pair_cost = attention_pair_cost(model.config)  # picks the cheaper layout step by step
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # before the LoRA wrap: the engine holds (or streams into) the plain model. Behavior log-probs are recorded
        # with every group: GRPO's ratios and every objective's drift diagnostics
        engine = make_engine(model, self.tokenizer, self.rollout_config, model_name_or_path, lora=lora is not None,
                             record_logprobs=True, uses_behavior_logp=self.objective.uses_behavior_logp,
                             lora_rank=lora.r if lora else None)
        self.policy = Policy(model, lora, compile)
        self.anchor_weight = self.objective_config.anchor_weight(self.rollout_config.staleness_limit)
        self.learner, self.reference = self.policy.learner, self.policy.reference  # registered: checkpoint keys
        self.group_rollout = GroupRollout(engine, self.tokenizer, self.rollout_config, chat_template)
        # an engine that serves adapters takes the adapter alone (and the base when a refresh changed it)
        weights = self.policy.adapter_weights if getattr(engine, "publishes_adapters", False) else \
            self.policy.engine_weights
        self.rollout_loop = RolloutLoop(self.rollout_config, self.group_rollout, weights)
        self.reference_cache = ReferenceLogprobCache()
        self.nan_guard = NanGuard(max_nan_steps)

    @property
    def engine(self) -> RolloutEngine:
        """The rollout engine (the behavior policy)."""
        return self.group_rollout.engine

    @property
    def generated_samples(self) -> int:
        """Responses generated by this process so far (the x-axis of sample efficiency)."""
        return self.group_rollout.generated_samples

    # ------------------------------------------------------------------ set-up

    def setup(self, stage: str) -> None:
        from ggpo_verifiers import get_verifier

        if self.group_rollout.verifier is None:
            self.group_rollout.verifier = get_verifier(self.verifier_spec, timeout=self.verifier_timeout)
        self.engine.to(self.device)
        rank = world()[0]
        if rank > 0 and stage == "fit":
            # every rank starts from the same seed: give each other rank its own sampling stream
            # (rank 0 keeps the stream a single process would have)
            torch.manual_seed(torch.initial_seed() + 1_000_003 * rank)
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None:
            return
        validate_golds(datamodule.train_rows + datamodule.val_rows, self.group_rollout.verifier)
        if datamodule.mode != "online":  # replayed data: every update moves the learner further from its behavior
            self.anchor_weight = self.objective_config.anchor_weight(None)

    def teardown(self, stage: str) -> None:
        if self.group_rollout.verifier is not None:
            self.group_rollout.verifier.close()
            self.group_rollout.verifier = None

    def train(self, mode: bool = True) -> GGPOModule:
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()  # frozen: no dropout, whatever Lightning toggles
        return self

    def configure_model(self) -> None:
        """Under bf16-mixed the frozen reference is kept in bf16 (:meth:`Policy.reference_in`). Under
        ``ModelParallelStrategy``: shard learner and reference with FSDP2 (:meth:`Policy.shard`); the engine keeps
        weights of its own."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if self._trainer is None:
            return
        bf16_mixed = str(self.trainer.precision) == "bf16-mixed"
        if bf16_mixed:
            self.policy.reference_in(torch.bfloat16)
        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        self.engine.unshare()  # its own copy, taken before the learner is sharded
        self.policy.shard(self.device_mesh, bf16_mixed=bf16_mixed)
        self.engine.to(self.device)

    def configure_callbacks(self) -> list[L.Callback]:
        # Callbacks, not module hooks: Lightning runs checkpoint callbacks last, so a checkpoint
        # taken at step s already holds the engine and reference as updated at step s.
        schedules: list[L.Callback] = [self.rollout_loop]
        if self.ref_refresh_every:
            schedules.append(ReferenceRefresh(self.ref_refresh_every))
        if type(self.trainer.progress_bar_callback) is RichProgressBar:  # Lightning's default bar: replaced
            schedules.append(StepProgressBar())
        return schedules

    # ------------------------------------------------------------------ the training step

    def training_step(self, dataloader_iter: Iterator) -> dict[str, Any] | None:
        # Taking the iterator (not a batch) stops Lightning from prefetching the next batch,
        # which would roll it out *before* this step's update and sync: one step staler than configured.
        step: TrainingBatch = next(dataloader_iter)[0]
        start = time.perf_counter()
        batch = self.pack(step.groups)
        # the step's loss (micro-batched in one pass or two, StepPasses); in one pass the backwards but the last's
        pending = self.passes.run(self.learner, batch, self.loss_terms(),
                                  lambda loss: self.trainer.strategy.backward(loss, None))
        metrics = self.step_metrics(batch, pending.inputs, pending.loss, step.rollout, pending.token_logp)
        if not torch.isfinite(metrics["loss"]):  # the mean over ranks: every rank skips the same steps
            return self._skip_nan_step()
        self.nan_guard.passed()
        loss = pending.finish()  # the remaining backwards but the last, which Lightning runs
        for name in ("loss", "reward", "staleness"):  # the progress bar's, and monitors' (e.g. ModelCheckpoint)
            self.log(f"train/{name}", metrics[name], prog_bar=True, logger=False, batch_size=len(step.groups))
        # to the loggers after the update; a NaN here means "no such responses in this step": left out
        self.record_step_metrics({f"train/{k}": v for k, v in metrics.items()}, nan_means_none=True)
        # the step's clock and token count go to on_train_batch_end, which runs after the update
        return {"loss": loss, "train_start": start, "train_tokens": batch.tokens}

    def pack(self, groups) -> StepBatch:
        """The step's groups as tensors on this device (with what the objective needs)."""
        # micro-batches take padded rows (a group may span several): no shared-prefix rows then
        return pack_step(groups, self.tokenizer.pad_token_id, self.device,
                         self.shared_prefix and not self.micro_batch.max_tokens,
                         require_behavior_logp=self.objective.uses_behavior_logp,
                         mask_truncated=self.rollout_config.truncation == "mask", pair_cost=self.attention_pair_cost)

    def step_loss(self, batch: StepBatch, token_logp: Tensor | None = None) -> tuple[Tensor, ObjectiveInputs]:
        """The whole step's :meth:`loss_terms` on ``batch`` and the inputs it was computed from, at the learner's
        token log-probs ``[B, L]`` (computed here with gradient when not given)."""
        if token_logp is None:
            token_logp = batch_token_logprobs(self.learner, batch, self.logprob_chunk_size)  # [B, L]
        return self.loss_terms()(batch, token_logp)

    def loss_terms(self) -> StepLoss:
        """The step's loss: the objective's, plus ``lambda`` times the behavior anchor when it is on
        (``docs/METHOD.md#the-behavior-anchor``), the reference's log-probs from :meth:`reference_logprobs`."""
        return StepLoss(self.objective, self.objective_config, self.anchor_weight, self.reference_logprobs)

    def reference_logprobs(self, batch: StepBatch) -> Tensor:
        """The reference's token log-probs ``[B, L]`` of ``batch``, without gradient: cached per group until the next
        refresh, micro-batched under ``model.micro_batch``."""
        budget, chunk = self.micro_batch.max_tokens, self.logprob_chunk_size
        forward = micro_batched_forward(budget, chunk, collective=self.policy.sharded) if budget else None
        with self.policy.reference_model() as reference, torch.no_grad():
            return self.reference_cache.token_logprobs(reference, batch, self.tokenizer.pad_token_id, chunk,
                                                       forward)  # [B, L]

    def step_metrics(self, batch: StepBatch, inputs: ObjectiveInputs, loss: Tensor,
                     rollout: RolloutBatch, token_logp: Tensor) -> dict[str, Tensor]:
        """The step's metrics and its rollout's, reduced over ranks, and the coverage of the learner by the behavior
        (:func:`~ggpo_lightning.core.metrics.coverage_metrics`: every rank's responses, ``token_logp`` ``[B, L]`` the
        learner's); verifier counts and reward checked once reduced (all ranks abort at one step, or none)."""
        metrics = step_metrics(inputs, loss, batch, self.global_step, self.objective_config.beta)
        metrics.update({k: torch.tensor(v) for k, v in rollout.metrics().items()})
        metrics["generated_samples"] = torch.tensor(float(self.generated_samples))  # cumulative: x-axis of efficiency
        metrics["lr"] = torch.tensor(self.trainer.optimizers[0].param_groups[0]["lr"])  # what this update uses
        metrics = reduce_step_metrics(metrics, self.device)
        metrics.update(coverage_metrics(token_logp, batch))
        verifier = {k.removeprefix("verifier/"): float(v) for k, v in metrics.items() if k.startswith("verifier/")}
        self.verifier_health.check_step(verifier, self.global_step, rollout.counts.verify_seconds,
                                        float(metrics["reward"]))
        return metrics

    def _skip_nan_step(self) -> None:
        """The step is skipped: gradients a one-pass step accumulated before its loss was known are dropped."""
        for optimizer in self.trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.record_step_metrics({"train/nan_steps": float(self.nan_guard.skip(self.trainer))})

    # ------------------------------------------------------------------ the reference schedule (its callback calls it)

    def refresh_reference(self) -> None:
        """The reference becomes the learner (:meth:`Policy.refresh_reference`); cached reference log-probs go."""
        self.reference_cache.clear()
        self.policy.refresh_reference(self.trainer.optimizers if self._trainer is not None else [])

    # ------------------------------------------------------------------ evaluation and export

    def evaluate(self, rows: list[PromptRow]) -> float:
        """Held-out accuracy of the learner on ``rows``: greedy pass@1, or one sample per prompt at
        ``eval.temperature`` from a fixed-seed forked RNG (validation never shifts the rollouts that follow).
        On several processes every rank must call it (:func:`~ggpo_lightning.evaluation.accuracy.count_correct`)."""
        if not rows:
            raise ValueError("evaluate() needs at least one prompt")
        # no generation meanwhile (async rollouts share the global RNG, seeded here, and the verifier pool)
        prompts = [self.group_rollout.encode(r.prompt, r.messages) for r in rows]
        sampling = self.rollout_config.sampling
        with self.rollout_loop.paused():
            accuracy, checks = heldout_accuracy(self.learner, self.tokenizer, prompts, [r.gold for r in rows],
                                                self.group_rollout.verifier, self.eval_config, sampling.top_p,
                                                sampling.max_new_tokens, self.device)
        self.verifier_health.check_evaluation(checks, f"held-out evaluation at step {self.global_step}")
        return accuracy

    def validation_step(self, rows: list[PromptRow], batch_idx: int) -> None:
        # already over all ranks; sync_dist only tells Lightning so (a mean of equal values)
        self.log("val/accuracy", self.evaluate(rows), prog_bar=True, batch_size=len(rows), sync_dist=True)

    def exports(self, run_dir: Path) -> dict[Path, Writer]:
        """The final export's folders and their writers (:func:`~ggpo_lightning.models.export.export_targets`)."""
        return export_targets(self.policy, self.tokenizer, self.model_name_or_path, run_dir)
