"""The learner's and the reference's decoder stack under ``torch.compile`` (recipe key ``model.compile``).

What is compiled: the decoder stack (embeddings, decoder layers, final norm) of the learner and of the reference,
in their log-prob forwards only (:data:`~ggpo_lightning.core.logprobs.DECODER_FORWARD`). The output head runs eagerly
in its chunks; generation (the rollout engine, even where it samples with the learner itself) never goes through it.

What it costs: compile time at the first step (a graph per model, layout and grad mode) and at each new width
bucket, on CPU tens of seconds per graph with inductor's C++ (a C++ compiler must be on the ``PATH``); inductor's
cache (``TORCHINDUCTOR_CACHE_DIR``) makes later runs of the same shapes load instead of compile.

Why buckets: a graph compiled for one row width serves that width only (``dynamic=False``: static kernels are the
fast ones), and a step's widths change with its responses' lengths. Each forward's rows are right-padded to
:func:`bucket_width`, so the widths a run meets are a few; recompiles stop once each has been seen. The row count
is marked dynamic instead (``maybe_mark_dynamic``; measured at toy size: rows 3, 4 and 6 of one width share one
graph, no padding needed; a single row specialises once). The padding does not change the numbers: padded columns
are masked out as keys of the real positions (2D masks: 0; shared-prefix 4D masks: False outside the real block,
each padded position attending to itself only, so no softmax row is empty), padded positions come after the real
ones (causal: they precede nothing), and the states of padded positions are cut off before the output head and
the loss. Micro-batches are planned on the unpadded widths (:mod:`ggpo_lightning.core.microbatch`): a compiled
forward's activations may exceed ``model.micro_batch.max_tokens`` by the bucket's padding (less than 32 tokens or
12.5% per row).

Measured at toy size (tests/training/test_compiled_training.py, tests/models/test_compiled.py): the compiled run's
losses equal the eager run's to 1.2e-7 relative over 5 fp32 steps; LoRA (the reference: the adapter off, a graph of
its own), micro-batches in one and two passes, gradient checkpointing and bf16-mixed run compiled.
"""

from __future__ import annotations

import functools
import shutil
import time
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ggpo_lightning.core.logprobs import DECODER_FORWARD, decoder_and_head

__all__ = ["BUCKET_STEP", "SHARDED_ERROR", "bucket_width", "compile_decoder", "compile_errors", "compile_metrics",
           "padded_forward"]

BUCKET_STEP = 8
"""The finest width step: widths up to 128 are padded to the next multiple of 8 (short packed rows, such as a group
of 8 short responses sharing a 20-token prompt, ~35 tokens, padded to 64 by a step of 32, nearly doubled the work)."""

RECOMPILE_LIMIT = 512
"""Dynamo's per-code-object graph limit while compiling decoders (its default, 8, is below one run's variants:
learner and reference share ``forward``'s code, each with both layouts, grad modes and every width bucket; past
the limit dynamo would run the new shapes eagerly, silently)."""


SHARDED_ERROR = ("model.compile: true is not supported with a sharding strategy (FSDP2); set model.compile: false "
                 "or trainer.strategy: ddp")
"""Why: tried at toy size on two gloo ranks, the compiled sharded stack gives the eager log-probs and gradients, but
FSDP2's per-layer hooks split it into a dozen compiled frames per forward (recompiled per bucket, little left to
fuse), and the sharded run under ``ModelParallelStrategy`` (refresh, sharded checkpoints) is untested compiled."""


def bucket_width(width: int) -> int:
    """The width a row of ``width`` tokens is padded to: the next multiple of ``max(8, p / 8)``, ``p`` the power of
    two below ``width``. Multiples of 8 up to 128, of 16 up to 256, of 32 up to 512, of 64 up to 1024...: less than 8
    tokens or 12.5% of padding (m30's 262-token rows: 288), and 16 widths up to 128, 8 more per doubling above (56 up
    to 4096)."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    step = max(BUCKET_STEP, (1 << (width - 1).bit_length()) // 16)  # the power of two at or above width, / 16
    return -(-width // step) * step


def compile_errors(compile: bool, sharded: bool) -> list[str]:
    """Why ``model.compile: true`` cannot run here (empty when it can, or when it is off): inductor's CPU kernels need
    a C++ compiler; a sharded learner (FSDP2) is refused (:data:`SHARDED_ERROR`). LoRA is supported (the reference is the same stack with
    the adapter off: a graph of its own)."""
    if not compile:
        return []
    errors = []
    if shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None:
        errors.append("model.compile: true needs a C++ compiler (g++ or clang++) on the PATH for inductor's CPU "
                      "kernels; install one or set model.compile: false")
    if sharded:
        errors.append(SHARDED_ERROR)
    return errors


def _pad_columns(value: Tensor, extra: int, fill: Any) -> Tensor:
    """``value`` ``[R, W]`` with ``extra`` columns of ``fill`` on the right: ``[R, W + extra]``."""
    return F.pad(value, (0, extra), value=fill)


def _pad_attention(attention: Tensor, width: int) -> Tensor:
    """A 2D ``[R, W]`` mask padded with 0, or a shared-prefix ``[R, 1, W, W]`` bool mask grown to ``[R, 1, width,
    width]``: False outside the real block, True on the padded diagonal (each padded position attends to itself
    only, so no query's softmax is over an empty row)."""
    extra = width - attention.shape[-1]
    if attention.dim() == 2:
        return _pad_columns(attention, extra, 0)  # [R, width]
    grown = F.pad(attention, (0, extra, 0, extra), value=False)  # [R, 1, width, width]
    padded = torch.arange(width, device=attention.device) >= attention.shape[-1]  # [width]
    return grown | torch.diag(padded).view(1, 1, width, width)  # [R, 1, width, width]


def padded_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward(body, **inputs)`` (a decoder stack ``body`` called on ``input_ids`` ``[R, W]``, ``attention_mask``
    ``[R, W]`` or ``[R, 1, W, W]`` and optionally ``position_ids`` ``[R, W]``) on rows right-padded to
    :func:`bucket_width`, its ``last_hidden_state`` cut back to ``[R, W, H]``; the row count marked dynamic for
    ``torch.compile``. Padded tokens are id 0: masked out, any id would do."""

    @functools.wraps(forward)
    def run(body: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None,
            **kwargs: Any) -> Any:
        width = input_ids.shape[1]
        extra = bucket_width(width) - width
        inputs = {"input_ids": _pad_columns(input_ids, extra, 0),  # [R, W']
                  "attention_mask": _pad_attention(attention_mask, width + extra)}  # [R, W'] or [R, 1, W', W']
        if position_ids is not None:
            inputs["position_ids"] = _pad_columns(position_ids, extra, 0)  # [R, W']
        for value in inputs.values():
            torch._dynamo.maybe_mark_dynamic(value, 0)
        out = forward(body, **inputs, **kwargs)
        out.last_hidden_state = out.last_hidden_state[:, :width]  # [R, W, H]
        return out

    return run


def _call(body: nn.Module, **inputs: Any) -> Any:
    return body(**inputs)


_compiled_call = padded_forward(torch.compile(_call, dynamic=False))
"""One compiled function for every decoder: dynamo keeps a graph per decoder (its guards), its limit raised."""


def compile_decoder(model: nn.Module) -> None:
    """Make ``model``'s log-prob forwards (:func:`~ggpo_lightning.core.logprobs.token_logprobs`,
    :func:`~ggpo_lightning.core.logprobs.packed_token_logprobs`) run its decoder stack compiled on bucketed widths.
    ``model``: a transformers causal LM, or a peft model around one; its parameters, state dict and ``forward`` (what
    generation calls) are unchanged, and a deep copy carries the compiled forward bound to itself. Raises ValueError
    when the model has no decoder stack apart from its output head."""
    parts = decoder_and_head(model)
    if parts is None:
        raise ValueError(f"model.compile: {type(model).__name__} has no decoder stack apart from its output head "
                         "(logit soft-capping or scaling); set model.compile: false")
    _clock()
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT)
    body = parts[0]
    setattr(body, DECODER_FORWARD, types.MethodType(_compiled_call, body))


class _CompileClock:
    """Wall seconds of ``torch.compile``'s outermost compile events (dynamo's callbacks: a frame traced and its forward
    graphs compiled, or a backward graph compiled at its first backward; nested events counted once), and the frames
    compiled."""

    def __init__(self) -> None:
        self.seconds, self.compiles, self._start = 0.0, 0, 0.0

    def start(self, args: Any) -> None:
        self._start = time.perf_counter()

    def end(self, args: Any) -> None:
        from torch._dynamo.callback import CallbackTrigger

        self.seconds += time.perf_counter() - self._start
        self.compiles += args.callback_trigger == CallbackTrigger.DYNAMO


@functools.cache
def _clock() -> _CompileClock:
    """The process's :class:`_CompileClock`, registered with dynamo at the first :func:`compile_decoder`."""
    from torch._dynamo.callback import on_compile_end, on_compile_start

    clock = _CompileClock()
    on_compile_start(clock.start)
    on_compile_end(clock.end)
    return clock


def compile_metrics() -> dict[str, float]:
    """The process's ``torch.compile`` totals so far: ``compile/seconds`` (wall time compiling: tracing and forward
    graphs at a new shape, backward graphs at their first backward) and ``compile/compiles`` (frames compiled: one per
    decoder, layout and grad mode at the first step, then one per recompile, e.g. a new width bucket; constant once
    warm). Zeros before any :func:`compile_decoder`."""
    clock = _clock()
    return {"compile/seconds": clock.seconds, "compile/compiles": float(clock.compiles)}
