"""The one place that chooses a rollout engine from the recipe (``model.rollout.engine``, ``vllm_placement``,
``schedule``, ``async_worker``): everything else sees the :class:`~ggpo_lightning.rollouts.engine.RolloutEngine`
protocol only."""

from __future__ import annotations

import os

from torch import nn

from ggpo_lightning.core.distributed import world
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.engine import RolloutEngine

__all__ = ["eval_engine", "make_engine", "placement_run_errors"]


def placement_run_errors(config: RolloutConfig, processes: int) -> list[str]:
    """What the engine's placement does not run with, beside its own settings (``RolloutConfig.errors``): the
    separate vLLM engine with several trainer processes. Each process would start its own engine, all on
    ``vllm_devices`` (one index) or each on its trainer's first device, beside that rank's learner, so they
    would contend for one device's memory. Checked by the preflight on the recipe and again here when the
    engine is made (``WORLD_SIZE`` of a launcher counts)."""
    if config.engine != "vllm" or config.vllm_placement != "separate" or processes <= 1:
        return []
    return [f"model.rollout.vllm_placement: separate runs one vLLM engine beside one trainer process; this run "
            f"has {processes} processes, whose engines would share a device with each other or with a learner "
            "(set trainer.devices and trainer.num_nodes to 1, or model.rollout.vllm_placement: colocated)"]


def make_engine(model: nn.Module, tokenizer, config: RolloutConfig, model_name_or_path: str, *, lora: bool,
                record_logprobs: bool) -> RolloutEngine:
    """The behavior policy's engine for ``model`` (the loaded learner, before any LoRA wrapping or sharding).

    - ``engine: vllm``: a vLLM engine built from ``model_name_or_path``, in this process (``colocated``) or in a
      child of its own (``separate``; it streams weights in ``model``'s plain layout);
    - ``engine: hf`` with ``schedule: async`` and ``async_worker: process``: the HF engine sampling in a child
      process on shared weights (CPU);
    - otherwise the HF engine in this process, sampling with the learner itself (no copy) when that is exact at
      every rollout (:meth:`~ggpo_lightning.rollouts.config.RolloutConfig.hf_engine_shares_learner`).
    """
    errors = placement_run_errors(config, max(world()[1], int(os.environ.get("WORLD_SIZE", "1"))))
    if errors:
        raise SettingsError(errors[0])
    dtype = config.torch_dtype
    if config.engine == "vllm" and config.vllm_placement == "separate":
        from ggpo_lightning.rollouts.vllm_separate import SeparateVLLMEngine

        return SeparateVLLMEngine(model_name_or_path, tokenizer, dtype or _dtype(model), layout=model.state_dict(),
                                  record_logprobs=record_logprobs, engine_args=config.vllm_args,
                                  devices=config.vllm_devices)
    if config.engine == "vllm":
        from ggpo_lightning.rollouts.vllm_engine import VLLMEngine

        return VLLMEngine(model_name_or_path, tokenizer, dtype or _dtype(model), record_logprobs=record_logprobs,
                          engine_args=config.vllm_args)
    if config.schedule == "async" and config.async_worker == "process":
        from ggpo_lightning.rollouts.child_engine import ChildProcessEngine

        return ChildProcessEngine(model, tokenizer, dtype=dtype, record_logprobs=record_logprobs)
    from ggpo_lightning.rollouts.hf_engine import HFGenerateEngine

    return HFGenerateEngine(model, tokenizer, dtype=dtype, record_logprobs=record_logprobs,
                            share=config.hf_engine_shares_learner(lora))


def eval_engine(model: nn.Module, tokenizer, engine_args: dict):
    """A vLLM engine holding ``model`` for ``ggpo eval --engine vllm`` (``generate`` and ``greedy``)."""
    from ggpo_lightning.rollouts.vllm_engine import VLLMEngine

    return VLLMEngine.from_model(model, tokenizer, engine_args=engine_args)


def _dtype(model: nn.Module):
    return next(model.parameters()).dtype
