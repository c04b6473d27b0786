"""The one place that chooses a rollout engine from the recipe (``model.rollout.engine``, ``servers``,
``schedule``, ``async_worker``): everything else sees the :class:`~ggpo_lightning.rollouts.protocol.RolloutEngine`
protocol only."""

from __future__ import annotations

import torch
from torch import nn

from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine

__all__ = ["eval_engine", "make_engine"]


def make_engine(model: nn.Module, tokenizer, config: RolloutConfig, model_name_or_path: str, *, lora: bool,
                record_logprobs: bool, uses_behavior_logp: bool = False, lora_rank: int | None = None) -> RolloutEngine:
    """The behavior policy's engine for ``model`` (the loaded learner, before any LoRA wrapping or sharding).

    - ``engine: vllm_server``: vLLM servers at ``servers`` (or local ones the engine starts), pushed the learner's
      weights before the first rollout (:mod:`~ggpo_lightning.rollouts.fleet.engine`); ``uses_behavior_logp`` picks
      the default of ``in_flight_updates``; with ``lora_rank`` (a LoRA run) it publishes adapters;
    - ``engine: vllm``: a vLLM engine built from ``model_name_or_path`` in this process;
    - ``engine: hf`` with ``schedule: async`` and ``async_worker: process``: the HF engine sampling in a child
      process on shared weights (CPU);
    - otherwise the HF engine in this process, sampling with the learner itself (no copy) when that is exact at
      every rollout (:meth:`~ggpo_lightning.rollouts.config.RolloutConfig.hf_engine_shares_learner`); with
      ``in_flight_updates: keep``, its syncs land inside the next rollout
      (:class:`~ggpo_lightning.rollouts.hf.in_flight.InFlightUpdates`).
    """
    dtype = config.torch_dtype
    if config.engine == "vllm_server":
        from ggpo_lightning.rollouts.fleet.engine import server_engine

        return server_engine(tokenizer, config, model_name_or_path, dtype or _dtype(model),
                             record_logprobs=record_logprobs and config.server_logprobs,
                             in_flight_updates=config.in_flight_mode(uses_behavior_logp), lora_rank=lora_rank)
    if config.engine == "vllm":
        from ggpo_lightning.rollouts.vllm.engine import VLLMEngine

        return VLLMEngine(model_name_or_path, tokenizer, dtype or _dtype(model), record_logprobs=record_logprobs,
                          engine_args=config.vllm_args)
    if config.schedule == "async" and config.async_worker == "process":
        from ggpo_lightning.rollouts.hf.child_process import ChildProcessEngine

        return ChildProcessEngine(model, tokenizer, dtype=dtype, record_logprobs=record_logprobs)
    from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine

    engine = HFGenerateEngine(model, tokenizer, dtype=dtype, record_logprobs=record_logprobs,
                              share=config.hf_engine_shares_learner(lora))
    if config.emulates_in_flight_updates:
        from ggpo_lightning.rollouts.hf.in_flight import InFlightUpdates

        return InFlightUpdates(engine, seed=torch.initial_seed())
    return engine


def eval_engine(model: nn.Module, tokenizer, engine_args: dict):
    """A vLLM engine holding ``model`` for ``ggpo eval --engine vllm`` (``generate`` and ``greedy``)."""
    from ggpo_lightning.rollouts.vllm.engine import VLLMEngine

    return VLLMEngine.from_model(model, tokenizer, engine_args=engine_args)


def _dtype(model: nn.Module):
    return next(model.parameters()).dtype
