"""Data-parallel helpers: ranks, shares of a step, gathers, reductions (FSDP2 sharding:
:mod:`ggpo_lightning.models.sharding`).

The trainer runs on one process or on many through Lightning strategies (``ddp`` or
``ModelParallelStrategy`` with FSDP2, gloo on CPUs and NCCL on GPUs). Everything here
works, and costs nothing, on a single process: ``world()`` is ``(0, 1)`` and the
collectives return their input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import os

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["all_gather_objects", "broadcast_from_rank0_", "gather_rows", "interleave",
           "launched_as_global_rank_zero", "max_across_ranks", "rank_share", "reduce_step_metrics", "sum_across_ranks",
           "world"]

T = TypeVar("T")

RANK_VARIABLES = ("RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_RANK", "SLURM_PROCID")
"""Where launchers put a process's place before its process group exists: torchrun (``RANK``, ``GROUP_RANK`` = the
node, ``LOCAL_RANK``), Lightning's own launcher (``NODE_RANK``, ``LOCAL_RANK``), SLURM (``SLURM_PROCID``)."""


def launched_as_global_rank_zero() -> bool:
    """Whether this process is the run's first (global rank 0) by its launcher's environment: the one process of
    all nodes that locks the run directory (each node's local rank 0 would otherwise take a lock of its own) and
    prints the run's memory estimate."""
    return all(int(os.environ.get(name) or 0) == 0 for name in RANK_VARIABLES)


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


def gather_rows(values: Tensor) -> Tensor:
    """Every rank's ``values`` (``[n_r, C]``, ``n_r`` may differ and be 0) concatenated in rank order, on ``values``'s
    device: ``[sum_r n_r, C]``; ``values`` itself on one process. For small per-response tables (pickled through the
    process group as CPU tensors)."""
    if world()[1] == 1:
        return values
    return torch.cat([t.to(values.device) for t in all_gather_objects(values.detach().cpu())])


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
def max_across_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` of all ranks (the value itself on one process)."""
    if world()[1] == 1:
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def broadcast_from_rank0_(tensors: Sequence[Tensor]) -> None:
    """Overwrite ``tensors`` in place with rank 0's values (replicas that drew different random numbers)."""
    if world()[1] == 1:
        return
    for tensor in tensors:
        dist.broadcast(tensor.data, src=0)


def _summed_metric(name: str) -> bool:
    """Metrics that add up over ranks (sample and token counts, verifier outcome counts, throughput); the rest are
    means."""
    return name in ("generated_samples", "response_tokens", "rollout_prompt_tokens", "rollout_tokens_per_s") or (
        name.startswith("verifier/") and name not in ("verifier/accuracy", "verifier/unboxed_share"))


def _maximum_metric(name: str) -> bool:
    """Metrics that are a maximum over the step's responses or groups (``staleness_max``, ``response_length_max``):
    their value over ranks is the largest."""
    return name.endswith("_max")


RATIO_METRICS = {"verifier/accuracy": ("verifier/correct", "verifier/total"),
                 "verifier/unboxed_share": ("verifier/unboxed", "verifier/total")}
"""Metrics that are a ratio of two summed counts: over ranks, the ratio of the sums (ranks may have scored different
numbers of responses: rank 0 scores them all when it rolls out for every rank)."""


def reduce_step_metrics(metrics: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """Each step metric over all ranks: counters and throughputs summed, ratios of counts (:data:`RATIO_METRICS`)
    recomputed from the sums, maxima (``*_max``) the largest (a second all-reduce, MAX), the rest averaged.

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
    reduced = {n: total if _summed_metric(n) else total / count for n, total, count in zip(names, sums, counts)}
    for ratio, (part, whole) in RATIO_METRICS.items():
        if ratio in reduced and part in reduced and whole in reduced:
            reduced[ratio] = reduced[part] / reduced[whole].clamp(min=1)
    maxima = [n for n in names if _maximum_metric(n)]
    if maxima:
        largest = torch.stack([metrics[n].detach().to(device, torch.float64) for n in maxima])  # [M_max]
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        reduced.update({n: value.float() for n, value in zip(maxima, largest)})
    return reduced
