"""GGPOModule: the learner, its frozen reference, the rollout engine and one training step.

One optimizer step (``training_step``) reads top to bottom:

1. pack the step's prompt groups into ``[B, L]`` token rows (``B = G x K``);
2. learner sequence log-probs with gradient, reference log-probs without;
3. the configured objective (``ggpo``, ``agro``, ``grpo``, ``maxrl``) on ``[G, K]``;
4. log the diagnostics of GGPO.md section 6.

After each optimizer update, two independent schedules run (``on_train_batch_end``):
the rollout engine gets the learner's weights every ``rollout.sync_every`` updates
(behavior staleness), and the reference becomes a copy of the learner every
``ref_refresh_every`` updates (a new Gibbs target).

A non-finite loss skips the step (counted, logged); ``max_nan_steps`` in a row stop the
run with a checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor

from ggpo_lightning.buffer import RolloutGroup
from ggpo_lightning.callbacks import ReferenceRefresh, RolloutSync
from ggpo_lightning.data import PromptRow
from ggpo_lightning.distributed import (all_gather_objects, broadcast_from_rank0_, copy_weights_, full_state_items,
                                        is_sharded, rank_share, shard_decoder_layers, sum_across_ranks, world)
from ggpo_lightning.logprobs import (pack_groups, pack_sequences, packed_token_logprobs, supports_packed,
                                    token_logprobs)
from ggpo_lightning.lora import (LoraSettings, adapter_disabled, base_fingerprint, merge_and_reset, plain_state_dict,
                                 save_adapter, wrap)
from ggpo_lightning.models import TinyModelConfig, ensure_tiny_model, load_causal_lm, load_tokenizer
from ggpo_lightning.objectives import get_objective, ggpo_diagnostics
from ggpo_lightning.rollout import HFGenerateEngine, SamplingConfig, encode_prompt, generate_responses

__all__ = ["GGPOModule", "RolloutConfig"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RolloutConfig:
    """The behavior policy: how many responses, how sampled, how stale."""

    k: int = 8
    """Responses per prompt (the group size K, >= 2)."""
    sync_every: int = 1
    """Copy the learner into the rollout engine every N optimizer updates (1 = near on-policy)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Temperature, top-p, response length, generation batch size."""
    dtype: str | None = None
    """Precision of the rollout model (``bfloat16`` for a learner in float32 = numerics mismatch); None = the learner's."""


def _summed_metric(name: str) -> bool:
    """Metrics that add up over ranks (sample counts, verifier outcome counts, throughput); the rest are means."""
    return name in ("generated_samples", "rollout_tokens_per_s") or (
        name.startswith("verifier/") and name not in ("verifier/accuracy", "verifier/unboxed_share"))


def _default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)


class GGPOModule(L.LightningModule):
    """Off-policy RL fine-tuning of a causal LM with verifiable rewards.

    Args:
        model_name_or_path: local folder or hub id of a transformers causal LM.
        tiny_model: build a tiny local model (tokenizer, Llama config, supervised
            warm-up) at ``model_name_or_path`` when that folder does not exist; for CPU
            runs and tests without downloads.
        objective: registered objective: ``ggpo``, ``agro``, ``grpo`` or ``maxrl``.
        beta: KL strength (> 0); GRPO's KL-penalty coefficient too.
        rollout: group size, sampling, sync schedule and precision of the behavior policy.
        verifier: answer checker: a registry name (``math``, ``numeric``, ``exact``, or
            a plugin) or ``{"class_path": ..., "init_args": ...}``.
        verifier_timeout: wall-clock seconds per answer check.
        ref_refresh_every: copy the learner into the reference every N optimizer updates
            (0 = never).
        optimizer: optimizer over the learner's parameters only.
        clip_eps: GRPO's ratio clip.
        kl_estimator: GRPO's per-token KL estimator in the loss: ``k1``, ``k2`` or ``k3``.
        logprob_chunk_size: response tokens per output-head chunk (bounds logits memory).
        shared_prefix: compute learner and reference log-probs on shared-prefix rows (one
            copy of a group's prompt for its K responses, no padding to the longest
            response; :func:`~ggpo_lightning.logprobs.pack_groups`): the same numbers with
            fewer token positions. Needs transformers' ``sdpa`` attention; other attention
            implementations use the padded layout.
        gradient_checkpointing: recompute activations in backward (less memory, more time).
        max_nan_steps: stop after this many non-finite losses in a row.
        eval_max_new_tokens: response length for held-out accuracy.
        eval_temperature: held-out accuracy decoding: 0 = greedy pass@1; > 0 = one sample
            per prompt at this temperature (top-p from ``rollout.sampling``).
        eval_batch_size: prompts per generation call during evaluation.
        chat_template: wrap each prompt as a user turn with the tokenizer's chat template
            (instruction-tuned models); False = the prompt text as it is (base models).
        lora: train a LoRA adapter on the frozen base instead of all weights (needs
            ``peft``). The reference is then the base with the adapter off (no second
            copy of the weights), a reference refresh merges the adapter into the base
            and starts a fresh one, and the rollout engine gets the merged weights
            (see :mod:`ggpo_lightning.lora`).
    """

    def __init__(
        self,
        model_name_or_path: str,
        tiny_model: TinyModelConfig | None = None,
        objective: str = "ggpo",
        beta: float = 0.04,
        rollout: RolloutConfig | None = None,
        verifier: str | dict = "math",
        verifier_timeout: float = 5.0,
        ref_refresh_every: int = 160,
        optimizer: OptimizerCallable = _default_optimizer,
        clip_eps: float = 0.2,
        kl_estimator: str = "k3",
        logprob_chunk_size: int = 4096,
        shared_prefix: bool = True,
        gradient_checkpointing: bool = False,
        max_nan_steps: int = 10,
        eval_max_new_tokens: int | None = None,
        eval_temperature: float = 0.0,
        eval_batch_size: int = 256,
        chat_template: bool = False,
        lora: LoraSettings | None = None,
    ) -> None:
        super().__init__()
        self.rollout_config = rollout or RolloutConfig()
        self._validate(objective, beta, verifier, self.rollout_config, ref_refresh_every, clip_eps, kl_estimator,
                       max_nan_steps, eval_temperature, lora)
        self.objective = get_objective(objective)
        self.beta = beta
        self.verifier_spec, self.verifier_timeout = verifier, verifier_timeout
        self.ref_refresh_every = ref_refresh_every
        self.optimizer_factory = optimizer
        self.clip_eps, self.kl_estimator = clip_eps, kl_estimator
        self.logprob_chunk_size = logprob_chunk_size
        self.max_nan_steps = max_nan_steps
        self.eval_max_new_tokens = eval_max_new_tokens or self.rollout_config.sampling.max_new_tokens
        self.eval_temperature = eval_temperature
        self.eval_batch_size = eval_batch_size

        if tiny_model is not None:
            ensure_tiny_model(model_name_or_path, tiny_model)
        self.model_name_or_path = model_name_or_path
        self.tokenizer = load_tokenizer(model_name_or_path)
        if chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"model.chat_template is true but the tokenizer of {model_name_or_path} has no chat "
                             "template; set model.chat_template: false or use an instruction-tuned model")
        self.chat_template = chat_template
        model = load_causal_lm(model_name_or_path, dtype=torch.float32).train()
        self.shared_prefix = shared_prefix and supports_packed(model)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        engine_dtype = _DTYPES[self.rollout_config.dtype] if self.rollout_config.dtype else None
        # synced after every update in the learner's precision, the engine would be an exact copy of the
        # learner at every rollout: it samples with the learner itself. Otherwise a private copy of the plain
        # model (with LoRA synced with the merged weights).
        share = lora is None and self.rollout_config.sync_every == 1 and engine_dtype is None
        self.engine = HFGenerateEngine(model, self.tokenizer, dtype=engine_dtype,
                                       record_logprobs=self.objective.uses_behavior_logp, share=share)
        self.lora = lora
        if lora is None:
            self.learner = model
            self.reference: torch.nn.Module | None = copy.deepcopy(model).requires_grad_(False).eval()
        else:
            self.base_fingerprint = base_fingerprint(model)  # what a resume checks the base against
            self.learner = wrap(model, lora)
            self.reference = None  # the learner with its adapter off
        self.verifier = None  # started in setup(): a process pool
        self.nan_steps = 0
        self._nan_streak = 0
        self._rollout_seconds = 0.0
        self._rollout_tokens = 0
        self._train_clock: tuple[float, int] | None = None
        self.generated_samples = 0
        self.lora_merges = 0  # reference refreshes merged into the base: the base is no longer the one on disk
        self._resync_engine = False  # set by a checkpoint that left the engine's weights to the learner's
        # reference log-probs by group (id -> (weak reference to the group, flat [N_g] tensor)); valid until the
        # next reference refresh, which clears it; an entry leaves with its group
        self._ref_cache: dict[int, tuple[weakref.ref, Tensor]] = {}

    @staticmethod
    def _validate(objective: str, beta: float, verifier: str | dict, rollout: RolloutConfig,
                  ref_refresh_every: int, clip_eps: float, kl_estimator: str, max_nan_steps: int,
                  eval_temperature: float, lora: LoraSettings | None) -> None:
        """All configuration errors at once, before any model is loaded."""
        from ggpo_verifiers import available_verifiers

        errors = []
        try:
            get_objective(objective)
        except ValueError as exc:
            errors.append(f"model.objective: {exc}")
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
            errors.append(f"model.beta must be a finite number > 0, got {beta!r}")
        if isinstance(verifier, str) and verifier not in available_verifiers():
            errors.append(f"model.verifier: unknown verifier {verifier!r}; available: "
                          f"{', '.join(available_verifiers())}")
        if ref_refresh_every < 0:
            errors.append(f"model.ref_refresh_every must be >= 0 (0 = never), got {ref_refresh_every}")
        if not 0 < clip_eps < 1:
            errors.append(f"model.clip_eps must be in (0, 1), got {clip_eps}")
        if kl_estimator not in ("k1", "k2", "k3"):
            errors.append(f"model.kl_estimator must be k1, k2 or k3, got {kl_estimator!r}")
        if max_nan_steps < 1:
            errors.append(f"model.max_nan_steps must be >= 1, got {max_nan_steps}")
        if not (math.isfinite(eval_temperature) and eval_temperature >= 0):
            errors.append(f"model.eval_temperature must be >= 0 (0 = greedy), got {eval_temperature}")
        if rollout.k < 2:
            errors.append(f"model.rollout.k must be >= 2 (GGPO contrasts responses within a group), got {rollout.k}")
        if rollout.sync_every < 1:
            errors.append(f"model.rollout.sync_every must be >= 1, got {rollout.sync_every}")
        if rollout.dtype is not None and rollout.dtype not in _DTYPES:
            errors.append(f"model.rollout.dtype must be one of {sorted(_DTYPES)} or null, got {rollout.dtype!r}")
        if lora is not None:
            errors.extend(lora.errors())
        if errors:
            raise ValueError("invalid configuration:\n  " + "\n  ".join(errors))

    # ------------------------------------------------------------------ set-up

    def setup(self, stage: str) -> None:
        from ggpo_verifiers import get_verifier

        if self.verifier is None:
            self.verifier = get_verifier(self.verifier_spec, timeout=self.verifier_timeout)
        self.engine.to(self.device)
        rank, _ = world()
        if rank > 0 and stage == "fit":
            # every rank starts from the same seed: give each other rank its own sampling stream
            # (rank 0 keeps the stream a single process would have)
            torch.manual_seed(torch.initial_seed() + 1_000_003 * rank)
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            self._validate_golds(datamodule.train_rows + datamodule.val_rows)

    def _validate_golds(self, rows: list[PromptRow]) -> None:
        """A gold answer the verifier cannot use is the dataset's fault: fail now, naming the row."""
        from ggpo_verifiers import GoldAnswerError

        try:
            self.verifier.validate_golds([r.gold for r in rows])
        except GoldAnswerError as exc:
            row = rows[exc.index]
            raise ValueError(f"{row.source}: {exc} (prompt id {row.id!r}); fix or drop the row") from exc

    def teardown(self, stage: str) -> None:
        if self.verifier is not None:
            self.verifier.close()
            self.verifier = None

    def train(self, mode: bool = True) -> GGPOModule:
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()  # frozen: no dropout, whatever Lightning toggles
        return self

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``: shard learner and reference with FSDP2, layer by layer.

        Both get the same data-parallel mesh and layout, so a reference refresh copies local
        shards. With ``bf16-mixed`` precision, layers are gathered and run in bfloat16 and
        gradients reduced in float32. The rollout engine keeps full weights: its own copy,
        also where one process samples with the learner itself (see ``sync_rollout_engine``).
        Other strategies (single device, DDP): nothing to do.
        """
        from lightning.pytorch.strategies import ModelParallelStrategy

        if self._trainer is None or not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        if is_sharded(self.learner):
            return  # configure_model runs again on a later fit/validate: shard once
        if self.lora is not None:
            raise ValueError("model.lora is not supported with ModelParallelStrategy (FSDP2) yet; use "
                             "trainer.strategy: ddp for LoRA on several devices")
        mesh = self.device_mesh
        if mesh["tensor_parallel"].size() > 1:
            raise ValueError(f"trainer.strategy: tensor parallelism is not supported; set "
                             f"tensor_parallel_size: 1 and data_parallel_size: {mesh.size()} (FSDP over all devices)")
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = None
        if str(self.trainer.precision) == "bf16-mixed":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if self.engine.shared:
            # sampling with the sharded learner would gather every layer at every generated token, and
            # deadlock when ranks stop generating at different lengths: the engine gets its own full copy
            self.engine = HFGenerateEngine(self.learner, self.tokenizer, record_logprobs=self.engine.record_logprobs)
            self.engine.to(self.device)
        for model in (self.learner, self.reference):
            shard_decoder_layers(model, mesh["data_parallel"], policy)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # with LoRA the frozen base has requires_grad=False: only the adapter reaches the optimizer
        return self.optimizer_factory([p for p in self.learner.parameters() if p.requires_grad])

    # ------------------------------------------------------------------ rollout

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt: as it is, or as a user turn of the chat template."""
        return encode_prompt(self.tokenizer, text, self.chat_template)

    @torch.no_grad()
    def rollout(self, rows: list[PromptRow]) -> list[RolloutGroup]:
        """K behavior responses per prompt from the rollout engine, scored by the verifier."""
        start = time.perf_counter()
        k = self.rollout_config.k
        with self._cached_weight_casts():
            generations = self.engine.generate([self.encode_prompt(r.prompt) for r in rows], k,
                                               self.rollout_config.sampling)
        responses = [text for g in generations for text in g.responses]
        rewards = self.verifier.score_batch(responses, [r.gold for r in rows for _ in range(k)])
        groups = [
            RolloutGroup(
                prompt_id=row.id, prompt=row.prompt, gold=row.gold, prompt_ids=g.prompt_ids,
                response_ids=g.response_ids, responses=g.responses,
                rewards=[float(x) for x in rewards[i * k:(i + 1) * k]],
                behavior_version=self.engine.version, behavior_logprobs=g.token_logprobs,
            )
            for i, (row, g) in enumerate(zip(rows, generations))
        ]
        self._rollout_seconds += time.perf_counter() - start
        self._rollout_tokens += sum(len(ids) for g in generations for ids in g.response_ids)
        self.generated_samples += len(responses)
        return groups

    @contextlib.contextmanager
    def _cached_weight_casts(self) -> Iterator[None]:
        """Under autocast, each weight is cast to the low precision once for the whole rollout instead of at
        every generated token: Lightning's autocast disables the weight-cast cache (right for one forward and
        backward, costly for a token-by-token loop). The same casts, so the same numbers."""
        device = self.device.type
        if not torch.is_autocast_enabled(device):
            yield
            return
        try:
            with torch.autocast(device, dtype=torch.get_autocast_dtype(device), cache_enabled=True):
                yield
        finally:
            torch.clear_autocast_cache()  # the casts of this rollout's weights: the next update changes them

    # ------------------------------------------------------------------ training

    def _pack(self, groups: list[RolloutGroup]) -> dict[str, Tensor]:
        """Token rows of every response plus the ``[G, K]`` layout of rewards and masks."""
        k_max = max(g.k for g in groups)
        prompts = [g.prompt_ids for g in groups for _ in range(g.k)]
        responses = [ids for g in groups for ids in g.response_ids]
        input_ids, attention, target = pack_sequences(prompts, responses, self.tokenizer.pad_token_id, self.device)
        group_mask = torch.tensor([[i < g.k for i in range(k_max)] for g in groups], device=self.device)  # [G, K]
        rewards = torch.tensor([g.rewards + [0.0] * (k_max - g.k) for g in groups], device=self.device)  # [G, K]
        batch = {"input_ids": input_ids, "attention_mask": attention, "target_mask": target,
                 "group_mask": group_mask, "rewards": rewards, "groups": groups,
                 "versions": torch.tensor([g.behavior_version for g in groups], device=self.device)}
        if self.shared_prefix:
            batch["packed"] = pack_groups([g.prompt_ids for g in groups], [g.response_ids for g in groups],
                                          self.tokenizer.pad_token_id, device=self.device)
        if self.objective.uses_behavior_logp:
            behavior = torch.zeros(input_ids.shape, device=self.device)  # [B, L]
            flat = [torch.tensor(lp) for g in groups for lp in (g.behavior_logprobs or [])]
            if len(flat) != len(responses):
                raise ValueError(f"objective {self.objective.name!r} needs behavior log-probs, but some "
                                 "groups lack them (a buffer file without behavior_logprobs?)")
            batch["behavior_token_logp"] = behavior.masked_scatter(target, torch.cat(flat).to(self.device))
        return batch

    def _to_groups(self, per_row: Tensor, group_mask: Tensor) -> Tensor:
        """Scatter a ``[B, ...]`` per-response tensor into ``[G, K, ...]`` (zeros where absent)."""
        out = per_row.new_zeros(group_mask.shape + per_row.shape[1:])
        out[group_mask] = per_row
        return out

    def _token_logprobs(self, model: torch.nn.Module, batch: dict[str, Any]) -> Tensor:
        """Token log-probs ``[B, L]`` (0 off the responses) of the batch's responses under ``model``:
        on the shared-prefix rows when the batch has them, else on the padded rows; equal up to rounding."""
        target = batch["target_mask"]  # [B, L]
        if "packed" not in batch:
            return token_logprobs(model, batch["input_ids"], batch["attention_mask"], target, self.logprob_chunk_size)
        flat = packed_token_logprobs(model, batch["packed"], self.logprob_chunk_size)  # [N]
        return torch.zeros(target.shape, device=flat.device).masked_scatter(target, flat)

    def _reference_token_logprobs(self, batch: dict[str, Any]) -> Tensor:
        """Reference token log-probs ``[B, L]`` (no grad) of the batch's responses.

        The reference is frozen between refreshes, so each group's values are computed the
        first time it is drawn and reused when it is drawn again (replay, offline data): only
        groups not yet seen since the last ``refresh_reference`` go through the reference.
        Reused values equal recomputed ones up to float rounding.
        """
        groups, target = batch["groups"], batch["target_mask"]
        missing = [g for g in groups if self._cached_reference(g) is None]
        if missing:
            sub = batch if len(missing) == len(groups) else self._pack(missing)
            with torch.no_grad(), self.reference_model() as reference:
                tokens = self._token_logprobs(reference, sub)  # [B', L']
            sizes = [sum(len(r) for r in g.response_ids) for g in missing]
            for group, values in zip(missing, tokens[sub["target_mask"]].split(sizes)):  # [N_g] each
                key, cache = id(group), self._ref_cache
                cache[key] = (weakref.ref(group, lambda _, key=key: cache.pop(key, None)), values)
        flat = torch.cat([self._cached_reference(g) for g in groups])  # [N]
        return torch.zeros(target.shape, device=flat.device).masked_scatter(target, flat)

    def _cached_reference(self, group: RolloutGroup) -> Tensor | None:
        entry = self._ref_cache.get(id(group))
        return entry[1] if entry is not None and entry[0]() is group else None

    def _loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch["group_mask"]  # [G, K]
        tok_logp = self._token_logprobs(self.learner, batch)  # [B, L]
        ref_tok = self._reference_token_logprobs(batch)  # [B, L]
        logp, ref_logp = tok_logp.sum(-1), ref_tok.sum(-1)  # [B]
        logp_g, ref_g = self._to_groups(logp, mask), self._to_groups(ref_logp, mask)  # [G, K]
        rewards = batch["rewards"]
        name = self.objective.name
        if name == "maxrl":
            loss = self.objective.loss(logp_g, rewards, mask)
        elif self.objective.level == "token":
            tmask = self._to_groups(batch["target_mask"], mask)  # [G, K, L]
            loss = self.objective.loss(
                self._to_groups(tok_logp, mask), self._to_groups(batch["behavior_token_logp"], mask), tmask,
                rewards, mask, clip_eps=self.clip_eps, kl_coef=self.beta,
                ref_token_logp=self._to_groups(ref_tok, mask), kl_estimator=self.kl_estimator)
        else:
            loss = self.objective.loss(logp_g, ref_g, rewards, self.beta, mask)
        metrics = ggpo_diagnostics(logp_g.detach(), ref_g, rewards, self.beta, mask)
        metrics["kl_ref"] = (logp.detach() - ref_logp).mean()  # sample estimate of KL(learner || reference)
        return loss, metrics

    def training_step(self, dataloader_iter: Iterator) -> Tensor | None:
        # Taking the iterator (not a batch) stops Lightning from prefetching the next batch,
        # which would roll it out *before* this step's update and sync: one step staler than configured.
        groups, _, _ = next(dataloader_iter)
        start = time.perf_counter()
        batch = self._pack(groups)
        loss, metrics = self._loss(batch)
        rewards, mask = batch["rewards"], batch["group_mask"]
        n = mask.sum().clamp(min=1)
        metrics.update(
            reward=(rewards * mask).sum() / n,
            accuracy=((rewards == 1) & mask).sum() / n,
            staleness=(self.global_step - batch["versions"]).float().mean(),
            rollout_seconds=torch.tensor(self._rollout_seconds),
            rollout_tokens_per_s=torch.tensor(self._rollout_tokens / max(self._rollout_seconds, 1e-9)),
            generated_samples=torch.tensor(float(self.generated_samples)),  # cumulative: x-axis of sample efficiency
        )
        self._rollout_seconds, self._rollout_tokens = 0.0, 0
        verifier_stats = self.verifier.reset_stats().as_dict(prefix="verifier/")
        metrics.update({k: torch.tensor(float(v)) for k, v in verifier_stats.items()})
        metrics = self._reduce_across_ranks({"loss": loss.detach(), **metrics})
        if not torch.isfinite(metrics["loss"]):  # the mean over ranks: every rank skips the same steps
            return self._skip_nan_step(metrics)
        self._nan_streak = 0
        self._train_clock = (start, int(batch["attention_mask"].sum()))  # read after the update
        self.log("train/loss", metrics.pop("loss"), prog_bar=True, batch_size=len(groups))
        self.log("train/reward", metrics.pop("reward"), prog_bar=True, batch_size=len(groups))
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, batch_size=len(groups))
        return loss

    def _reduce_across_ranks(self, metrics: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each step metric over all ranks, in one all-reduce: counters and throughputs summed, the rest averaged.

        Every rank holds the same number of groups, so the mean of the ranks' losses is the
        loss of the whole step's groups, as on one process.
        """
        _, world_size = world()
        if world_size == 1:
            return metrics
        names = list(metrics)
        totals = sum_across_ranks(torch.stack([metrics[n].detach().float().to(self.device) for n in names]))
        return {n: total if _summed_metric(n) else total / world_size for n, total in zip(names, totals)}

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

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Here the backward pass and the optimizer update are done: the step's full training time.
        if self._train_clock is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start, tokens = self._train_clock
        seconds = time.perf_counter() - start
        self._train_clock = None
        self.log_dict({"train/train_seconds": seconds, "train/train_tokens_per_s": tokens / max(seconds, 1e-9)},
                      batch_size=1)

    def _skip_nan_step(self, metrics: dict[str, Tensor]) -> None:
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

    def configure_callbacks(self) -> list[L.Callback]:
        # Callbacks, not module hooks: Lightning runs checkpoint callbacks last, so a checkpoint
        # taken at step s already holds the engine and reference as updated at step s.
        schedules: list[L.Callback] = [RolloutSync(self.rollout_config.sync_every)]
        if self.ref_refresh_every:
            schedules.append(ReferenceRefresh(self.ref_refresh_every))
        return schedules

    def reference_model(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The reference policy, as a context: the frozen copy, or with LoRA the learner with its adapter off."""
        return contextlib.nullcontext(self.reference) if self.lora is None else adapter_disabled(self.learner)

    def sync_rollout_engine(self) -> None:
        """Copy the learner's weights into the rollout engine (the behavior policy); with LoRA, merged.

        Sharded (FSDP2): every rank gathers the full weights, one tensor at a time, into its
        own engine: one gather per sync, and each rank then generates for its own prompts.
        """
        if is_sharded(self.learner):
            weights = full_state_items(self.learner)
        else:
            weights = self.learner if self.lora is None else plain_state_dict(self.learner, merged=True)
        self.engine.load_weights(weights, version=self.global_step)

    def refresh_reference(self) -> None:
        """Make the reference a copy of the learner: a new Gibbs target.

        With LoRA the adapter is merged into the base and a fresh one starts
        (``W <- W + s * B A``, ``B = 0``; :func:`~ggpo_lightning.lora.merge_and_reset`): the
        reference (adapter off) then equals the learner, as after a full-weight refresh. The
        optimizer's state is reset too: Adam's moments describe the old adapter (the fresh
        one's ``A`` is re-drawn), and carrying them over would push the new adapter along
        directions that no longer mean anything; a refresh restarts the optimizer as it
        restarts the KL term.
        """
        self._ref_cache.clear()  # log-probs of the old reference
        if self.lora is None:
            copy_weights_(self.reference, self.learner)  # sharded alike: local shards, no communication
            return
        merge_and_reset(self.learner)
        # the fresh adapter's A is drawn from each rank's own RNG stream: replicas take rank 0's
        broadcast_from_rank0_([p for p in self.learner.parameters() if p.requires_grad])
        self.lora_merges += 1
        for optimizer in self.trainer.optimizers if self._trainer is not None else []:
            optimizer.state.clear()  # it holds the adapter's parameters only

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, rows: list[PromptRow]) -> float:
        """Held-out accuracy (pass@1: greedy, or one sample at ``eval_temperature``) of the learner on ``rows``.

        Sampled evaluation draws from a forked, fixed-seed RNG: it neither consumes nor
        depends on the training RNG, so validation does not change the rollouts that follow.

        On several processes every rank must call it: each scores its share of ``rows``
        and the counts are summed. A sharded learner's forward is a collective, so all
        ranks make the same number of ``generate`` calls (a rank out of prompts repeats
        one and discards the result) and generate with ``synced_gpus``.
        """
        if not rows:
            raise ValueError("evaluate() needs at least one prompt")
        decoding: dict[str, Any] = {"do_sample": False}
        if self.eval_temperature > 0:
            decoding = {"do_sample": True, "temperature": self.eval_temperature,
                        "top_p": self.rollout_config.sampling.top_p, "top_k": 0}
        if is_sharded(self.learner):
            decoding["synced_gpus"] = True
        rank, world_size = world()
        share = rank_share(rows, rank, world_size)
        calls = math.ceil(math.ceil(len(rows) / world_size) / self.eval_batch_size)
        was_training = self.learner.training
        self.learner.eval()
        responses: list[list[int]] = []
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(0)
            for start in range(0, calls * self.eval_batch_size, self.eval_batch_size):
                batch = share[start:start + self.eval_batch_size]
                prompts = [self.encode_prompt(r.prompt) for r in batch or rows[:1]]
                generated = generate_responses(self.learner, self.tokenizer, prompts, self.eval_max_new_tokens,
                                               **decoding)
                responses.extend(generated[:len(batch)])
        self.learner.train(was_training)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        scores = self.verifier.score_batch(texts, [r.gold for r in share]) if share else []
        correct, total = sum_across_ranks(torch.tensor([float(sum(scores)), float(len(share))], dtype=torch.float64,
                                                        device=self.device))
        return float(correct / total)

    def validation_step(self, rows: list[PromptRow], batch_idx: int) -> None:
        # already over all ranks; sync_dist only tells Lightning so (a mean of equal values)
        self.log("val/accuracy", self.evaluate(rows), prog_bar=True, batch_size=len(rows), sync_dist=True)

    # ------------------------------------------------------------------ export

    def exports(self, run_dir: Path) -> dict[Path, Callable[[Path], None]]:
        """The final export: each target folder and a function that writes its content into a given folder.

        Full fine-tuning: ``final_model/``, the learner (transformers ``save_pretrained``).
        LoRA: ``final_adapter/``, the adapter as peft saves it, loadable with
        ``PeftModel.from_pretrained(base, path)``. Its base is the one the run started from,
        unless reference refreshes merged adapters into it: then that merged base is saved
        as ``final_adapter/base/`` and ``adapter_config.json`` names it (the adapter on the
        original base would not be the trained learner). With ``lora.export_merged`` also
        ``final_model/``: base and adapter merged, a plain transformers model. Each folder
        holds the tokenizer too.

        Sharded (FSDP2): every rank must call it (the full weights are gathered to rank 0,
        which alone gets the writer); the export is the same single ``save_pretrained``
        folder as from one process.
        """
        if self.lora is None:
            if is_sharded(self.learner):
                return self._gathered_export(run_dir / "final_model")
            return {run_dir / "final_model": self._writer(self.learner.save_pretrained)}
        adapter_dir = run_dir / "final_adapter"

        def write_adapter(directory: Path) -> None:
            base = self.model_name_or_path
            if self.lora_merges:
                self._writer(self._save_plain(merged=False))(directory / "base")
                base = str((adapter_dir / "base").resolve())
            save_adapter(self.learner, directory, base)
            self.tokenizer.save_pretrained(directory)

        targets = {adapter_dir: write_adapter}
        if self.lora.export_merged:
            targets[run_dir / "final_model"] = self._writer(self._save_plain(merged=True))
        return targets

    def _gathered_export(self, target: Path) -> dict[Path, Callable[[Path], None]]:
        """The sharded learner's full weights on rank 0, as a plain transformers model there (nothing elsewhere)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from transformers import AutoModelForCausalLM

        state = get_model_state_dict(self.learner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if world()[0] != 0:
            return {}
        with torch.device("meta"):  # no second initialization: the weights are assigned
            plain = AutoModelForCausalLM.from_config(self.learner.config)
        plain.load_state_dict(state, assign=True)
        plain.tie_weights()
        return {target: self._writer(plain.save_pretrained)}

    def _save_plain(self, merged: bool) -> Callable[[Path], None]:
        """Saves the LoRA learner as a plain transformers model: base alone, or base and adapter merged."""
        return lambda directory: self.learner.get_base_model().save_pretrained(
            directory, state_dict=plain_state_dict(self.learner, merged=merged))

    def _writer(self, save_model: Callable[[Path], None]) -> Callable[[Path], None]:
        def write(directory: Path) -> None:
            save_model(directory)
            self.tokenizer.save_pretrained(directory)

        return write

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Called on every rank; Lightning writes rank 0's dict, so the per-rank state is gathered into it.
        checkpoint["ggpo"] = {
            "model_name_or_path": self.model_name_or_path,  # what ggpo eval loads the learner weights into
            "engine_version": self.engine.version,
            "engine_state": self._engine_state_to_save(),
            "nan_steps": self.nan_steps,
            "ranks": all_gather_objects({"rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
                                         "generated_samples": self.generated_samples}),
        }
        if self.lora is not None:
            checkpoint["ggpo"]["lora"] = {"settings": asdict(self.lora), "base_fingerprint": self.base_fingerprint,
                                          "merges": self.lora_merges}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["ggpo"]
        self._check_base(state)
        if state["engine_state"] is None:
            self._resync_engine = True  # it held the learner's weights of this step, restored later
        elif not self.engine.shared:
            self.engine.model.load_state_dict(state["engine_state"])
        self.engine.version = state["engine_version"]
        self.nan_steps = state["nan_steps"]
        # checkpoints before per-rank state held one process's state at the top level
        self._restore_rank_state(state.get("ranks") or [{k: state[k] for k in ("rng", "generated_samples")}])
        if self.lora is not None:
            self.lora_merges = state["lora"]["merges"]

    def _engine_state_to_save(self) -> dict[str, Tensor] | None:
        """The engine's weights, or None where a resume can rebuild them from the learner's.

        An engine synced at this very step holds the learner's weights (cast or merged as a
        sync does), and a shared engine is the learner: saving them again would add a full
        model copy to every checkpoint (on rank 0, in one file). A resume then syncs once
        the learner's weights are restored (``on_train_start``); a stale engine's weights
        are saved.
        """
        if self.engine.shared or self.engine.version == self.global_step:
            return None
        return self.engine.model.state_dict()  # full weights, the same on every rank

    def on_train_start(self) -> None:
        if self._resync_engine:
            self.sync_rollout_engine()  # at the restored step: the checkpoint's engine_version
            self._resync_engine = False

    def _restore_rank_state(self, ranks: list[dict[str, Any]]) -> None:
        """This rank's sampling RNG and sample count, so that a resumed run draws what an uninterrupted one would.

        A checkpoint written by another number of processes resumes too (the weights are
        resharded by the strategy), but the per-rank sampling streams cannot be mapped:
        each rank keeps its fresh seed, and the run continues without repeating the
        uninterrupted one draw for draw.
        """
        rank, world_size = world()
        if len(ranks) == world_size:
            mine = ranks[rank]
            torch.set_rng_state(mine["rng"]["torch"])
            random.setstate(mine["rng"]["python"])
            self.generated_samples = mine["generated_samples"]
            return
        log.warning("the checkpoint was written by %d processes and resumes on %d: the per-rank sampling RNG "
                    "starts fresh (the run continues, but not draw for draw as it would have)", len(ranks),
                    world_size)
        self.generated_samples = sum(r["generated_samples"] for r in ranks) if rank == 0 else 0

    def _check_base(self, state: dict[str, Any]) -> None:
        """A LoRA checkpoint resumes only on the base it was trained on (and only as LoRA).

        The checkpoint's ``state_dict`` holds the whole learner, base included: reference
        refreshes merge adapters into the base, so the base in memory is no longer the one
        on disk and a resume must restore it to continue identically. The base on disk is
        referenced by ``model_name_or_path`` and a fingerprint of its config and
        embedding (:func:`~ggpo_lightning.lora.base_fingerprint`), checked here.
        """
        saved = state.get("lora")
        if (saved is None) != (self.lora is None):
            raise ValueError(f"the checkpoint was trained {'with' if saved else 'without'} model.lora but this run "
                             f"is configured {'with' if self.lora else 'without'} it; resume with the run's own "
                             "model.lora")
        if saved is not None and saved["base_fingerprint"] != self.base_fingerprint:
            raise ValueError(f"the checkpoint's adapter was trained on base model {state['model_name_or_path']!r}, but "
                             f"this run loads {self.model_name_or_path!r}, a different model (fingerprint "
                             f"{self.base_fingerprint} != {saved['base_fingerprint']}); resume with "
                             f"--model.model_name_or_path {state['model_name_or_path']}")
