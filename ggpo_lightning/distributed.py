"""Data-parallel and sharded training helpers: ranks, FSDP2 sharding, gathers, reductions.

The trainer runs on one process or on many through Lightning strategies (``ddp`` or
``ModelParallelStrategy`` with FSDP2, gloo on CPUs and NCCL on GPUs). Everything here
works, and costs nothing, on a single process: ``world()`` is ``(0, 1)`` and the
collectives return their input.

Sharding (``shard_decoder_layers``) follows the FSDP2 recipe: ``fully_shard`` on every
decoder layer, then on the root, so each layer's weights are gathered only while that
layer runs. Learner and reference are sharded with the same mesh and layout, so a
reference refresh copies local shards (``copy_weights_``) without any communication.
The rollout engine holds full weights: ``full_state_items`` gathers them tensor by
tensor, once per sync.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ggpo_lightning.logprobs import SHARDED_FORWARDS

__all__ = ["all_gather_objects", "broadcast_from_rank0_", "copy_weights_", "decoder_layers", "full_state_items", "interleave", "is_sharded",
           "rank_share", "shard_decoder_layers", "sum_across_ranks", "world"]

T = TypeVar("T")


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process; ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_share(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """This rank's items: every ``world_size``-th, from position ``rank`` (disjoint, together all of them)."""
    return list(items[rank::world_size])


def interleave(shares: Sequence[Sequence[T]]) -> list[T]:
    """The inverse of ``rank_share``: ``shares[r]`` held items ``r, r + W, ...`` of one list; that list back."""
    total = sum(len(share) for share in shares)
    return [shares[i % len(shares)][i // len(shares)] for i in range(total)]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (pickled through the process group); ``[obj]`` on one process."""
    _, world_size = world()
    if world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def sum_across_ranks(values: Tensor) -> Tensor:
    """Element-wise sum of ``values`` over all ranks (one all-reduce); ``values`` itself on one process.

    The sum runs in float64 on the tensor's device (exact counts; gloo cannot reduce bfloat16), cast back after.
    """
    _, world_size = world()
    if world_size == 1:
        return values
    total = values.detach().to(torch.float64).clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(values.dtype)


@torch.no_grad()
def broadcast_from_rank0_(tensors: Sequence[Tensor]) -> None:
    """Overwrite ``tensors`` in place with rank 0's values (replicas that drew different random numbers)."""
    if world()[1] == 1:
        return
    for tensor in tensors:
        dist.broadcast(tensor.data, src=0)


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


def _summed_metric(name: str) -> bool:
    """Metrics that add up over ranks (sample counts, verifier outcome counts, throughput); the rest are means."""
    return name in ("generated_samples", "rollout_tokens_per_s") or (
        name.startswith("verifier/") and name not in ("verifier/accuracy", "verifier/unboxed_share"))


def reduce_step_metrics(metrics: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """Each step metric over all ranks, in one all-reduce: counters and throughputs summed, the rest averaged.

    Every rank holds the same number of groups, so the mean of the ranks' losses is the
    loss of the whole step's groups, as on one process. A NaN ``loss`` on any rank makes the
    mean NaN on every rank (so all skip the step alike); any other NaN metric (a rank
    without such responses, e.g. no correct one) is left out of its mean.
    """
    _, world_size = world()
    if world_size == 1:
        return metrics
    names = list(metrics)
    values = torch.stack([metrics[n].detach().float().to(device) for n in names])  # [M]
    present = ~torch.isnan(values) | torch.tensor([n == "loss" for n in names], device=device)  # [M]
    totals = sum_across_ranks(torch.cat([torch.where(present, values, torch.zeros_like(values)),
                                         present.float()]))  # [2M]
    sums, counts = totals[:len(names)], totals[len(names):]
    return {n: total if _summed_metric(n) else total / count for n, total, count in zip(names, sums, counts)}
