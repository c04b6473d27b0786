"""FSDP2 sharding of learner and reference, and the weight copies that cross it.

Sharding (:func:`shard_decoder_layers`) follows the FSDP2 recipe: ``fully_shard`` on every
decoder layer, then on the root, so each layer's weights are gathered only while that
layer runs. Learner and reference are sharded with the same mesh and layout, so a
reference refresh copies local shards (:func:`copy_weights_`) without any communication.
The rollout engine holds full weights: :func:`full_state_items` gathers them tensor by
tensor, once per sync.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ggpo_lightning.core.logprobs import SHARDED_FORWARDS

__all__ = ["copy_weights_", "decoder_layers", "full_state_items", "is_sharded", "shard_decoder_layers"]


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are FSDP2 shards (``DTensor``)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a transformers model, the units FSDP2 shards one by one.

    Found by the class names transformers lists in ``_no_split_modules`` (e.g.
    ``LlamaDecoderLayer``, ``Qwen3DecoderLayer``). Raises ValueError when a model names
    none, or none of its modules has such a class.
    """
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"FSDP sharding needs the model's decoder layers, but {type(model).__name__} has no recognizable ones "
            f"(transformers' _no_split_modules names {sorted(names) or 'nothing'}); train it with "
            "trainer.strategy: ddp instead, or use a transformers causal LM with decoder layers")
    return layers


def shard_decoder_layers(model: nn.Module, mesh: Any, mixed_precision: Any = None) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, output head)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    kwargs = {"mesh": mesh} if mixed_precision is None else {"mesh": mesh, "mp_policy": mixed_precision}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    # log-probs run body and head apart (chunked), not model.forward: make them forwards of the root unit
    for name, computation in SHARDED_FORWARDS.items():
        setattr(model, name, types.MethodType(computation, model))
        register_fsdp_forward_method(model, name)
    return model


def _local(tensor: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def copy_weights_(target: nn.Module, source: nn.Module) -> None:
    """Copy ``source``'s parameters and buffers into ``target``'s, shard by shard (no communication).

    Both modules must have the same structure and, when sharded, the same sharding; a
    mismatch of names or shapes is an error, not a partial copy.
    """
    source_state, target_state = source.state_dict(), target.state_dict()
    if source_state.keys() != target_state.keys():
        missing = sorted(source_state.keys() ^ target_state.keys())[:5]
        raise ValueError(f"cannot copy weights between modules of different structure (differing keys: {missing})")
    for name, value in source_state.items():
        into, src = _local(target_state[name]), _local(value)
        if into.shape != src.shape:
            raise ValueError(f"cannot copy {name}: shapes {tuple(src.shape)} and {tuple(into.shape)} differ")
        into.copy_(src)


@torch.no_grad()
def full_state_items(module: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, full tensor)`` for each entry of ``module.state_dict()``, gathering shards one tensor at a time.

    Every rank must iterate to the end (each sharded entry is a collective); the peak
    extra memory is one full tensor, not a full copy of the model.
    """
    from torch.distributed.tensor import DTensor

    for name, value in module.state_dict().items():
        yield name, value.full_tensor() if isinstance(value, DTensor) else value
