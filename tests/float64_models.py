"""Float64 models for tests that compare two computations of one quantity (micro-batched against the single pass,
shared-prefix against padded rows): the ``float64`` fixture of ``conftest.py``.

Why not float32: two orders of the same sums differ by a few ulps there, and how many depends on the CPU's kernels
(the native AVX512 ones against AVX2's or the default, ``ATEN_CPU_CAPABILITY``): a float32 tolerance one CPU meets
fails on the next. Objectives that subtract two sums of log-probs amplify it: MaxRL takes a mean over successes minus
a mean over all, ~13 nats each for a difference of 0.28, so log-probs 1 ulp apart (a micro-batch whose rows come in
another order) give losses 2.5e-6 apart, relative. In float64 the same paths agree to ~1e-15 (measured on the tiny
model, every objective and split).

The tolerance, :data:`FLOAT64_TOLERANCE`: a sum of ``n`` terms of total magnitude ``S`` is exact to ``n u S`` in any
order, at float64's unit roundoff ``u = 1.1e-16``. The tiny model's sums have ``n <= 1e3`` terms and ``S <= 1e2``
(the largest gradient entry is ~7), so ``1e-11``, rounded up to ``1e-10``: independent of the summation order, hence
of the kernels, and still 1e4 below any real difference between two paths (a lost term, another formula: >= 1e-6).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

FLOAT64_TOLERANCE = {"rtol": 1e-10, "atol": 1e-10}
"""``torch.testing.assert_close``'s tolerance for two float64 computations of one quantity (the module docstring)."""


def rms_norm_in_float64(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' Llama/Qwen3 RMSNorm in float64 for a float64 input. Theirs computes in float32 whatever the input
    (an upcast for bf16, a downcast for float64): a float64 model would still round every norm to float32, and its
    paths would differ by ~1e-7 (measured: the gradients of the micro-batched and single passes)."""
    dtype = hidden_states.dtype
    hidden = hidden_states.to(torch.promote_types(dtype, torch.float32))
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * hidden.to(dtype)


def float64_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the test's duration, the RMSNorm of the tiny models (Llama) and the Qwen3-shaped ones in float64."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm_in_float64)
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", rms_norm_in_float64)


def to_float64(target: nn.Module) -> nn.Module:
    """A GGPOModule's learner and frozen reference (with LoRA: the learner, adapters included), or a bare model,
    in float64; returned."""
    policy = getattr(target, "policy", None)
    if policy is None:
        return target.double()
    policy.learner.double()
    policy.reference_in(torch.float64)
    return target
