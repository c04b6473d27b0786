"""The rollout engine protocol: what the trainer needs from the behavior policy, whatever runs it.

An engine holds its *own* copy of the model. It changes only when the trainer calls
``load_weights`` (every ``model.rollout.sync_every`` optimizer updates), so between syncs it
is a stale snapshot of the learner, the behavior policy ``mu`` GGPO learns from. The
implementations (:mod:`~ggpo_lightning.rollouts.hf.engine` and its child-process variant,
:mod:`~ggpo_lightning.rollouts.vllm.engine`, :mod:`~ggpo_lightning.rollouts.fleet.engine`) are chosen in one
place, :func:`~ggpo_lightning.rollouts.factory.make_engine`; any object with these methods can replace them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Union, runtime_checkable

import torch
from torch import Tensor, nn

from ggpo_lightning.rollouts.config import SamplingConfig

__all__ = ["AdapterWeights", "Generation", "RolloutEngine", "SyncedOnResume", "Weights", "autocast_device", "cached_weight_casts",
           "copy_pairs", "weight_pairs"]

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """The K sampled responses to one prompt (token ids end with EOS when the model stopped)."""

    prompt_ids: list[int]
    response_ids: list[list[int]]
    responses: list[str]
    token_logprobs: list[list[float]] | None
    """Per-token log-probs under the engine's model at temperature 1 (before temperature and
    top-p), when the engine records them: what ratio-based objectives (GRPO) compare against."""
    versions: list[list[int]] | None = None
    """Per response ``[first, last]``: the weight versions that sampled its first and its last token, when the engine
    tags them (vLLM servers); None: every response came from the engine's ``version`` at the call."""


Weights = Union[nn.Module, Mapping[str, Tensor], Iterable[tuple[str, Tensor]]]
"""What a rollout engine loads: a model, a state dict, or a stream of ``(name, tensor)`` pairs."""


@dataclass
class AdapterWeights:
    """A LoRA learner as an engine that serves adapters takes it (vLLM servers: ``publishes_adapters``): the base,
    pushed again only when ``base_revision`` changes (a reference refresh merged the adapter into it), and the
    adapter, which ``save`` writes into a folder in ``peft``'s format."""

    base: Callable[[], Weights]
    """The base's weights, without the adapter (plain names)."""
    save: Callable[[Path], None]
    """Writes the adapter (``adapter_config.json``, ``adapter_model.safetensors``) into the folder given."""
    base_revision: int
    """Times an adapter was merged into the base (``Policy.lora_merges``)."""


def weight_pairs(weights: Weights) -> Iterable[tuple[str, Tensor]]:
    """``weights`` as ``(name, tensor)`` pairs: a model's or a state dict's items (by reference), or the stream
    itself."""
    if isinstance(weights, nn.Module):
        return weights.state_dict().items()
    return weights.items() if isinstance(weights, Mapping) else weights


def copy_pairs(target: Mapping[str, Tensor], pairs: Iterable[tuple[str, Tensor]]) -> None:
    """Copy streamed ``(name, tensor)`` pairs into ``target``'s tensors (e.g. a model's state) in place; every entry
    exactly once."""
    seen = set()
    for name, tensor in pairs:
        if name not in target:
            raise KeyError(f"the engine's model has no weight named {name!r}")
        target[name].copy_(tensor)
        seen.add(name)
    if seen != target.keys():
        raise KeyError(f"weights missing from the stream: {sorted(target.keys() - seen)[:5]}")


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a rollout engine."""

    version: int
    """Optimizer step of the learner whose weights the engine holds."""

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        """Sample ``n`` responses for each prompt (token ids), one ``Generation`` per prompt, in order."""
        ...

    def load_weights(self, learner: Weights, version: int) -> None:
        """Copy the learner's weights (a model, its plain ``state_dict``, e.g. LoRA-merged, or
        ``(name, tensor)`` pairs, e.g. gathered from shards) into the engine's model and record ``version``."""
        ...

    def to(self, device: torch.device | str) -> RolloutEngine:
        """Move the engine's model to ``device`` (engines that place themselves ignore it)."""
        ...

    def unshare(self) -> None:
        """Sample with weights of the engine's own from now on, never with the learner's tensors (the learner is
        about to be sharded). A no-op for an engine that never shares."""
        ...

    def state_dict(self, step: int) -> dict[str, Tensor] | None:
        """The weights a checkpoint at learner step ``step`` must hold to restore this engine; None where a resume
        rebuilds them by syncing from the learner (synced at ``step``, sampling with the learner, or weights that
        cannot be saved)."""
        ...

    def load_state_dict(self, state: dict[str, Tensor] | None, version: int) -> bool:
        """Restore a checkpoint's :meth:`state_dict` and ``version``; True when the weights were not in it and the
        engine must be synced from the learner before it samples again."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond memory (child processes); idempotent; a later call may restart it."""
        ...


@contextlib.contextmanager
def cached_weight_casts(engine: RolloutEngine) -> Iterator[None]:
    """Under autocast, each weight is cast to the low precision once for the whole rollout instead of at every
    generated token: Lightning's autocast disables the weight-cast cache (right for one forward and backward,
    costly for a token-by-token loop). The same casts, so the same numbers."""
    device = autocast_device(engine)
    if device is None:
        yield
        return
    try:
        with torch.autocast(device, dtype=torch.get_autocast_dtype(device), cache_enabled=True):
            yield
    finally:
        torch.clear_autocast_cache()  # the casts of this rollout's weights: the next update changes them


def autocast_device(engine: RolloutEngine) -> str | None:
    """The device type of the engine's model when autocast is on for it in this thread; None when off or for an
    engine of another framework (it does its own casts)."""
    model = getattr(engine, "model", None)
    if model is None:
        return None
    device = next(model.parameters()).device.type
    return device if torch.is_autocast_enabled(device) else None


class SyncedOnResume:
    """The checkpoint side of an engine whose weights are never saved (vLLM's live under its fused names): a resume
    syncs it from the learner, which is exact when the checkpoint was taken at a sync."""

    version: int

    def unshare(self) -> None:
        """Never shares the learner's tensors: nothing to do."""

    def state_dict(self, step: int) -> None:
        if self.version != step:
            log.warning("checkpoint at step %d: the %s holds step %d's weights, which are not saved; a resume from it "
                        "syncs the engine early (at step %d). Take checkpoints at multiples of model.rollout.sync_every "
                        "for an exact resume.", step, type(self).__name__, self.version, step)
        return None

    def load_state_dict(self, state: dict[str, Tensor] | None, version: int) -> bool:
        self.version = version
        return True
