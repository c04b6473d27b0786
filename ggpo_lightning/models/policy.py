"""The trained policies of a run: learner and frozen reference, with every LoRA and FSDP branch.

:class:`Policy` is a plain component (no Lightning): the module registers its
``learner`` and ``reference`` as submodules (so checkpoints hold ``learner.*`` and
``reference.*``) and calls the operations below on the schedules of
``docs/METHOD.md#reference-refresh`` and the rollout sync:

- :meth:`Policy.engine_weights`: the learner's weights as the rollout engine (the
  behavior policy) loads them; with LoRA merged, under FSDP2 gathered one tensor at a time;
- :meth:`Policy.refresh_reference`: the reference becomes the learner (a new Gibbs
  target); with LoRA the adapter is merged into the base and a fresh one starts;
- :meth:`Policy.shard`: FSDP2 layout of learner and reference;
- :meth:`Policy.reference_model`: the reference as a context (with LoRA: adapter off).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict

import torch
from torch import nn

from ggpo_lightning.records.errors import ResumeError, SettingsError
from ggpo_lightning.models.checkpoint import LoraState, RunState
from ggpo_lightning.models.compiled import SHARDED_ERROR, compile_decoder
from ggpo_lightning.core.distributed import broadcast_from_rank0_
from ggpo_lightning.models.sharding import copy_weights_, full_state_items, is_sharded, shard_decoder_layers
from ggpo_lightning.models.lora import (LoraSettings, adapter_disabled, base_fingerprint, merge_and_reset, plain_state_dict,
                                 save_adapter, wrap)
from ggpo_lightning.rollouts.protocol import AdapterWeights, Weights

__all__ = ["Policy"]


class Policy:
    """Learner + reference built from one loaded model (the rollout engine is a component of its own,
    :mod:`ggpo_lightning.rollouts`, that loads :meth:`engine_weights` at each sync).

    Args:
        model: the loaded causal LM (float32, train mode); becomes the learner (wrapped
            with a LoRA adapter when ``lora`` is set).
        lora: train a LoRA adapter instead of all weights; the reference is then the base
            with the adapter off (no second copy of the weights).
        compile: the decoder stacks of learner and reference run compiled in their log-prob forwards
            (:func:`~ggpo_lightning.models.compiled.compile_decoder`; not with :meth:`shard`).
    """

    def __init__(self, model: nn.Module, lora: LoraSettings | None, compile: bool = False) -> None:
        self.lora, self.compiled = lora, compile
        self.lora_merges = 0  # reference refreshes merged into the base: the base is no longer the one on disk
        if lora is None:
            self.learner = model
            self.reference: nn.Module | None = copy.deepcopy(model).requires_grad_(False).eval()
        else:
            self.base_fingerprint = base_fingerprint(model)  # what a resume checks the base against
            self.learner = wrap(model, lora)
            self.reference = None  # the learner with its adapter off
        if compile:
            for policy in (self.learner, self.reference):
                if policy is not None:
                    compile_decoder(policy)

    @property
    def sharded(self) -> bool:
        return is_sharded(self.learner)

    def reference_model(self) -> contextlib.AbstractContextManager[nn.Module]:
        """The reference policy, as a context: the frozen copy, or with LoRA the learner with its adapter off."""
        return contextlib.nullcontext(self.reference) if self.lora is None else adapter_disabled(self.learner)

    def reference_in(self, dtype: torch.dtype) -> None:
        """Keep the frozen reference copy in ``dtype`` (bf16 under bf16-mixed: autocast runs its matmuls in bf16
        anyway, so only the norms and embeddings round differently; half the memory and no per-forward cast).
        A refresh copies the learner into it with a cast. No-op with LoRA (the reference is the learner's base)."""
        if self.reference is not None:
            self.reference.to(dtype)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates: all learner weights, or with LoRA only the adapter."""
        return [p for p in self.learner.parameters() if p.requires_grad]

    def shard(self, mesh, bf16_mixed: bool) -> None:
        """FSDP2: every decoder layer of learner and reference a ``fully_shard`` unit on ``mesh``'s
        data-parallel dimension (same layout, so a refresh copies local shards); with ``bf16_mixed`` layers are
        gathered and run in bfloat16 and gradients reduced in float32. Idempotent. The rollout engine must then
        sample with weights of its own (:meth:`RolloutEngine.unshare`): sampling with the sharded learner would
        gather every layer at every generated token, and deadlock when ranks stop generating at different
        lengths."""
        if self.sharded:
            return
        if self.compiled:
            raise SettingsError(SHARDED_ERROR)
        if self.lora is not None:
            raise SettingsError("model.lora is not supported with ModelParallelStrategy (FSDP2) yet; use "
                                "trainer.strategy: ddp for LoRA on several devices")
        if mesh["tensor_parallel"].size() > 1:
            raise SettingsError(f"trainer.strategy: tensor parallelism is not supported; set tensor_parallel_size: 1 "
                                f"and data_parallel_size: {mesh.size()} (FSDP over all devices)")
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_mixed else None
        for model in (self.learner, self.reference):
            shard_decoder_layers(model, mesh["data_parallel"], policy)

    def engine_weights(self) -> Weights:
        """The learner's weights as a rollout engine loads them (:meth:`RolloutEngine.load_weights`): the model itself,
        LoRA merged into a plain state dict, or under FSDP2 the full weights gathered one tensor at a time (every rank
        takes part: one gather per sync, each rank then generates for its own prompts)."""
        if self.sharded:
            return full_state_items(self.learner)
        return self.learner if self.lora is None else plain_state_dict(self.learner, merged=True)

    def adapter_weights(self) -> AdapterWeights:
        """The LoRA learner as an engine that serves adapters loads it (:class:`AdapterWeights`): the base (the
        original, or with the merged adapters of earlier refreshes) and the adapter. Without sharding only (LoRA is
        refused under FSDP2)."""
        if self.lora is None:
            raise ValueError("adapter_weights needs a LoRA learner (model.lora)")
        return AdapterWeights(base=lambda: plain_state_dict(self.learner, merged=False),
                              save=lambda folder: save_adapter(self.learner, folder, "base"),
                              base_revision=self.lora_merges)

    def refresh_reference(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Make the reference a copy of the learner: a new Gibbs target.

        With LoRA the adapter is merged into the base and a fresh one starts
        (``W <- W + s * B A``, ``B = 0``; :func:`~ggpo_lightning.models.lora.merge_and_reset`): the
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
        embedding (:func:`~ggpo_lightning.models.lora.base_fingerprint`), checked here.
        """
        saved = state.lora
        if (saved is None) != (self.lora is None):
            raise ResumeError(f"the checkpoint was trained {'with' if saved else 'without'} model.lora but this run "
                              f"is configured {'with' if self.lora else 'without'} it; resume with the run's own "
                              "model.lora")
        if saved is not None and saved.base_fingerprint != self.base_fingerprint:
            raise ResumeError(f"the checkpoint's adapter was trained on base model {state.model_name_or_path!r}, but "
                              f"this run loads {model_name_or_path!r}, a different model (fingerprint "
                              f"{self.base_fingerprint} != {saved.base_fingerprint}); resume with "
                              f"--model.model_name_or_path {state.model_name_or_path}")

