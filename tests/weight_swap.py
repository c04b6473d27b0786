"""Weights to swap in mid-generation with an exact reference (the in-flight update tests)."""

from __future__ import annotations

import copy

import torch


def final_norm_changed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` with another final norm: other next-token logits, the same keys and values at every position, so the
    cache that the old weights filled is the new weights' own and a swap mid-generation has an exact reference."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    norm = other.get_decoder().norm.weight
    with torch.no_grad():
        norm.copy_(torch.randn(norm.shape, generator=generator))
    return other
