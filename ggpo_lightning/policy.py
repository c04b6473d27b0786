"""The policies of a run: learner, frozen reference and rollout engine, with every LoRA and FSDP branch.

:class:`Policy` is a plain component (no Lightning): the module registers its
``learner`` and ``reference`` as submodules (so checkpoints hold ``learner.*`` and
``reference.*``) and calls the operations below on the schedules of
``docs/METHOD.md#reference-refresh`` and the rollout sync:

- :meth:`Policy.sync_engine`: the learner's weights into the rollout engine (the
  behavior policy); with LoRA merged, under FSDP2 gathered one tensor at a time;
- :meth:`Policy.refresh_reference`: the reference becomes the learner (a new Gibbs
  target); with LoRA the adapter is merged into the base and a fresh one starts;
- :meth:`Policy.shard`: FSDP2 layout of learner and reference;
- :meth:`Policy.reference_model`: the reference as a context (with LoRA: adapter off).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import asdict

import torch
from torch import Tensor, nn

from ggpo_lightning.checkpoint import LoraState, RunState
from ggpo_lightning.distributed import (broadcast_from_rank0_, copy_weights_, full_state_items, is_sharded,
                                        shard_decoder_layers)
from ggpo_lightning.lora import (LoraSettings, adapter_disabled, base_fingerprint, merge_and_reset, plain_state_dict,
                                 wrap)
from ggpo_lightning.rollout import HFGenerateEngine, RolloutConfig, RolloutEngine, weight_pairs

__all__ = ["Policy"]

log = logging.getLogger(__name__)


class Policy:
    """Learner + reference + rollout engine built from one loaded model.

    Args:
        model: the loaded causal LM (float32, train mode); becomes the learner (wrapped
            with a LoRA adapter when ``lora`` is set).
        tokenizer: its tokenizer (the engine decodes with it).
        lora: train a LoRA adapter instead of all weights; the reference is then the base
            with the adapter off (no second copy of the weights).
        rollout: the engine (``hf`` or ``vllm``, colocated or separate), its precision (None = the learner's) and
            sync interval; the HF engine samples with the learner itself when it would be
            an exact copy at every rollout (sync every update, the learner's precision, no LoRA).
        model_name_or_path: where ``model`` was loaded from (the vLLM engine loads it too).
        record_logprobs: the engine records behavior token log-probs with every group.
    """

    def __init__(self, model: nn.Module, tokenizer, lora: LoraSettings | None, rollout: RolloutConfig,
                 model_name_or_path: str, record_logprobs: bool) -> None:
        self.engine: RolloutEngine
        if rollout.engine == "vllm" and rollout.vllm_placement == "separate":
            from ggpo_lightning.vllm_separate import SeparateVLLMEngine

            # layout: the plain model's state (LoRA not wrapped yet, FSDP not sharded yet), what a sync streams
            self.engine = SeparateVLLMEngine(model_name_or_path, tokenizer, rollout.torch_dtype or _dtype(model),
                                             layout=model.state_dict(), record_logprobs=record_logprobs,
                                             engine_args=rollout.vllm_args, devices=rollout.vllm_devices)
        elif rollout.engine == "vllm":
            from ggpo_lightning.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(model_name_or_path, tokenizer, rollout.torch_dtype or _dtype(model),
                                     record_logprobs=record_logprobs, engine_args=rollout.vllm_args)
        elif rollout.mode == "async" and rollout.async_worker == "process":
            from ggpo_lightning.child_engine import ChildProcessEngine

            self.engine = ChildProcessEngine(model, tokenizer, dtype=rollout.torch_dtype,
                                             record_logprobs=record_logprobs)
        else:
            # async: the producer samples while the learner trains, so never with the learner itself
            share = lora is None and rollout.sync_every == 1 and rollout.torch_dtype is None and rollout.mode == "sync"
            self.engine = HFGenerateEngine(model, tokenizer, dtype=rollout.torch_dtype,
                                           record_logprobs=record_logprobs, share=share)
        self.lora = lora
        self.lora_merges = 0  # reference refreshes merged into the base: the base is no longer the one on disk
        if lora is None:
            self.learner = model
            self.reference: nn.Module | None = copy.deepcopy(model).requires_grad_(False).eval()
        else:
            self.base_fingerprint = base_fingerprint(model)  # what a resume checks the base against
            self.learner = wrap(model, lora)
            self.reference = None  # the learner with its adapter off

    @property
    def sharded(self) -> bool:
        return is_sharded(self.learner)

    def reference_model(self) -> contextlib.AbstractContextManager[nn.Module]:
        """The reference policy, as a context: the frozen copy, or with LoRA the learner with its adapter off."""
        return contextlib.nullcontext(self.reference) if self.lora is None else adapter_disabled(self.learner)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates: all learner weights, or with LoRA only the adapter."""
        return [p for p in self.learner.parameters() if p.requires_grad]

    def shard(self, mesh, bf16_mixed: bool) -> None:
        """FSDP2: every decoder layer of learner and reference a ``fully_shard`` unit on ``mesh``'s
        data-parallel dimension (same layout, so a refresh copies local shards); with ``bf16_mixed`` layers are
        gathered and run in bfloat16 and gradients reduced in float32. The engine keeps full weights: its own
        copy, also where it would sample with the learner (that would gather every layer at every generated
        token, and deadlock when ranks stop generating at different lengths). Idempotent."""
        if self.sharded:
            return
        if self.lora is not None:
            raise ValueError("model.lora is not supported with ModelParallelStrategy (FSDP2) yet; use "
                             "trainer.strategy: ddp for LoRA on several devices")
        if mesh["tensor_parallel"].size() > 1:
            raise ValueError(f"trainer.strategy: tensor parallelism is not supported; set "
                             f"tensor_parallel_size: 1 and data_parallel_size: {mesh.size()} (FSDP over all devices)")
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_mixed else None
        if isinstance(self.engine, HFGenerateEngine):
            self.engine.unshare()
        for model in (self.learner, self.reference):
            shard_decoder_layers(model, mesh["data_parallel"], policy)

    def sync_engine(self, version: int) -> None:
        """Copy the learner's weights into the rollout engine and record ``version``; with LoRA, merged.

        Sharded (FSDP2): every rank gathers the full weights, one tensor at a time, into its
        own engine: one gather per sync, and each rank then generates for its own prompts.
        """
        self.engine.load_weights(self._engine_weights(), version=version)

    def engine_weights_copy(self) -> dict[str, Tensor]:
        """What :meth:`sync_engine` would load, as a copy of its own (the asynchronous hand-off: the producer loads
        it later, while the learner trains on): one more copy of the model in memory until loaded."""
        return {name: tensor.detach().clone() for name, tensor in weight_pairs(self._engine_weights())}

    def _engine_weights(self):
        """The learner's weights as the engine loads them: the model itself, merged (LoRA) or gathered (FSDP2)."""
        if self.sharded:
            return full_state_items(self.learner)
        return self.learner if self.lora is None else plain_state_dict(self.learner, merged=True)

    def refresh_reference(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Make the reference a copy of the learner: a new Gibbs target.

        With LoRA the adapter is merged into the base and a fresh one starts
        (``W <- W + s * B A``, ``B = 0``; :func:`~ggpo_lightning.lora.merge_and_reset`): the
        reference (adapter off) then equals the learner, as after a full-weight refresh. The
        ``optimizers``' state is reset too: Adam's moments describe the old adapter (the
        fresh one's ``A`` is re-drawn), and carrying them over would push the new adapter
        along directions that no longer mean anything.
        """
        if self.lora is None:
            copy_weights_(self.reference, self.learner)  # sharded alike: local shards, no communication
            return
        merge_and_reset(self.learner)
        # the fresh adapter's A is drawn from each rank's own RNG stream: replicas take rank 0's
        broadcast_from_rank0_(self.trainable_parameters())
        self.lora_merges += 1
        for optimizer in optimizers:
            optimizer.state.clear()  # it holds the adapter's parameters only

    def engine_state_to_save(self, step: int) -> dict[str, Tensor] | None:
        """The engine's weights, or None where a resume can rebuild them from the learner's.

        An engine synced at this very step holds the learner's weights (cast or merged as a
        sync does), and a shared engine is the learner: saving them again would add a full
        model copy to every checkpoint (on rank 0, in one file). A resume then syncs once
        the learner's weights are restored; a stale HF engine's weights are saved. A vLLM
        engine's weights are never saved (they are under vLLM's fused names): a resume from
        a checkpoint taken between two syncs starts with the learner's weights, one early sync.
        """
        if not isinstance(self.engine, HFGenerateEngine):
            if self.engine.version != step:
                log.warning("checkpoint at step %d: the vLLM rollout engine holds step %d's weights, which are not "
                            "saved; a resume from it syncs the engine early (at step %d). Take checkpoints at "
                            "multiples of model.rollout.sync_every for an exact resume.", step, self.engine.version,
                            step)
            return None
        if self.engine.shared or self.engine.version == step:
            return None
        return self.engine.model.state_dict()  # full weights, the same on every rank

    def restore_engine(self, state: dict[str, Tensor] | None, version: int) -> bool:
        """Load a checkpoint's engine weights; True when they were left out and must be re-synced."""
        self.engine.version = version
        if state is None or not isinstance(self.engine, HFGenerateEngine):
            return True  # a vLLM engine (its weights never saved) re-syncs from the learner
        if not self.engine.shared:
            self.engine.model.load_state_dict(state)
        return False

    def lora_state(self) -> LoraState | None:
        """What a checkpoint records of the adapter and its base (None without LoRA)."""
        if self.lora is None:
            return None
        return LoraState(asdict(self.lora), self.base_fingerprint, self.lora_merges)

    def check_resumable(self, state: RunState, model_name_or_path: str) -> None:
        """A LoRA checkpoint resumes only on the base it was trained on (and only as LoRA).

        The checkpoint's ``state_dict`` holds the whole learner, base included: reference
        refreshes merge adapters into the base, so the base in memory is no longer the one
        on disk and a resume must restore it to continue identically. The base on disk is
        referenced by ``model_name_or_path`` and a fingerprint of its config and
        embedding (:func:`~ggpo_lightning.lora.base_fingerprint`), checked here.
        """
        saved = state.lora
        if (saved is None) != (self.lora is None):
            raise ValueError(f"the checkpoint was trained {'with' if saved else 'without'} model.lora but this run "
                             f"is configured {'with' if self.lora else 'without'} it; resume with the run's own "
                             "model.lora")
        if saved is not None and saved.base_fingerprint != self.base_fingerprint:
            raise ValueError(f"the checkpoint's adapter was trained on base model {state.model_name_or_path!r}, but "
                             f"this run loads {model_name_or_path!r}, a different model (fingerprint "
                             f"{self.base_fingerprint} != {saved.base_fingerprint}); resume with "
                             f"--model.model_name_or_path {state.model_name_or_path}")


def _dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype
