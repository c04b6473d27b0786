"""Per-token and per-sequence log-probabilities of responses under a causal LM.

Layout: each row of ``input_ids`` ``[B, L]`` is ``prompt + response`` (right-padded),
``target_mask`` ``[B, L]`` is True at the positions of response tokens. The log-prob
of the token at position ``p`` comes from the logits at ``p - 1``.

Only response positions go through the output head, in chunks of ``chunk_size``
tokens, each chunk under activation checkpointing when gradients are on. So neither
the forward nor the backward holds the full fp32 ``[B, L, V]`` logits: the peak is
``chunk_size x V`` floats, whatever the batch and vocabulary. No forward keeps a key-value
cache (``use_cache=False``): transformers' default builds one, which in a no-gradient forward
(reference, the first pass of a micro-batched step) holds every layer's keys and values until the
forward returns.

The shared-prefix layout (:func:`pack_groups`, :func:`packed_token_logprobs`) computes the
same log-probs with less work: the K responses of a prompt group share one copy of the
prompt in one row, each response attending to the prompt and to itself only (a 4D
attention mask, position ids restarting after the prompt), and no row is padded to the
longest response of the batch. A group of 8 responses of ~4 tokens to a ~7-token prompt
takes 39 token positions instead of 8 x 11 padded ones. Its rows are wider, though, and attention
over a row is dense (every query against every key, the mask applied after): where responses are long
next to their prompt, the wider rows cost more than the prompt copies they save
(:func:`layout_cost`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from dataclasses import dataclass

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["DECODER_FORWARD", "SHARDED_FORWARDS", "PackedGroups", "attention_pair_cost",
           "chunked_packed_token_logprobs", "chunked_token_logprobs", "decoder_and_head", "layout_cost", "pack_groups",
           "logprob_dtype", "pack_sequences", "packed_shape", "packed_token_logprobs", "response_token_logprobs",
           "sequence_logprobs", "supports_packed", "token_logprobs"]


def logprob_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype log-probs are computed and kept in for a model computing in ``dtype``: float32 for half precision
    (a log-softmax in bf16 loses the small differences the objectives take) and float32, the model's own where it is
    wider (float64: the paths of a step then agree to float64 rounding, whatever the CPU's kernels)."""
    return torch.promote_types(dtype, torch.float32)


def pack_sequences(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ``prompt + response`` rows: ``(input_ids, attention_mask, target_mask)``, each ``[B, L]``.

    ``target_mask`` is True at the response tokens. Right padding keeps position ids
    ``0..len-1`` for every row, the same positions ``generate`` gives left-padded prompts.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (e.g. BOS) to condition the response on")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    target = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attention[i, : len(p) + len(r)] = 1
        target[i, len(p): len(p) + len(r)] = True
    return input_ids.to(device), attention.to(device), target.to(device)


@dataclass
class PackedGroups:
    """Prompt groups in shared-prefix rows (see :func:`pack_groups`)."""

    input_ids: Tensor  # [R, W]
    position_ids: Tensor  # [R, W]
    attention: Tensor  # [R, 1, W, W] bool: True where query (dim 2) may attend to key (dim 3)
    context: Tensor  # [N] flat index (row * W + column) of the state that predicts each target token
    targets: Tensor  # [N] the response tokens, response after response in the order given


def pack_groups(prompts: list[list[int]], responses: list[list[list[int]]], pad_id: int,
                max_row_tokens: int = 512, device: torch.device | str | None = None) -> PackedGroups:
    """Rows of ``prompt + response_1 + response_2 + ...``: one prompt copy per row, no padding inside.

    ``responses[g]`` are the responses to ``prompts[g]``. A row takes the next response of
    its group while it stays within ``max_row_tokens`` (a response longer than that gets a
    row of its own); otherwise a new row starts with another copy of the prompt. Response
    tokens sit at positions ``len(prompt), len(prompt) + 1, ...`` (as if alone after the
    prompt) and attend causally to the prompt and to their own response only, so the
    model sees exactly the context it sees in :func:`pack_sequences`' layout. Rows are
    right-padded to the longest row; padding attends only to the prompt and padding.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (e.g. BOS) to condition the response on")
    plan, _ = _plan_rows([len(p) for p in prompts], [[len(r) for r in g] for g in responses], max_row_tokens)
    rows: list[tuple[list[int], list[int], list[int]]] = []  # (tokens, positions, segment: 0 prompt, s response s)
    context: list[tuple[int, int]] = []  # (row, column) predicting each target
    targets: list[int] = []
    for prompt, group, row_of in zip(prompts, responses, plan):
        for response, r in zip(group, row_of):
            if r == len(rows):
                rows.append((list(prompt), list(range(len(prompt))), [0] * len(prompt)))
            tokens, positions, segments = rows[r]
            segment, start = segments[-1] + 1, len(tokens)
            predictors = ([len(prompt) - 1] + list(range(start, start + len(response) - 1)))[:len(response)]
            context.extend((r, c) for c in predictors)
            targets.extend(response)
            tokens.extend(response)
            positions.extend(range(len(prompt), len(prompt) + len(response)))
            segments.extend([segment] * len(response))
    width = max(len(r[0]) for r in rows)
    pad = [(width - len(r[0])) for r in rows]
    input_ids = torch.tensor([r[0] + [pad_id] * n for r, n in zip(rows, pad)])  # [R, W]
    position_ids = torch.tensor([r[1] + [0] * n for r, n in zip(rows, pad)])  # [R, W]
    segment = torch.tensor([r[2] + [-1] * n for r, n in zip(rows, pad)])  # [R, W]
    causal = torch.ones(width, width, dtype=torch.bool).tril()  # [W, W]
    same = (segment.unsqueeze(1) == 0) | (segment.unsqueeze(1) == segment.unsqueeze(2))  # [R, Wq, Wk]
    flat = torch.tensor([r * width + c for r, c in context], dtype=torch.long)  # [N]
    return PackedGroups(input_ids.to(device), position_ids.to(device), (same & causal).unsqueeze(1).to(device),
                        flat.to(device), torch.tensor(targets, dtype=torch.long, device=device))


def packed_shape(prompts: list[list[int]], responses: list[list[list[int]]],
                 max_row_tokens: int = 512) -> tuple[int, int]:
    """``(rows, width)`` of :func:`pack_groups`' rows for these groups, from their lengths alone (nothing built)."""
    _, widths = _plan_rows([len(p) for p in prompts], [[len(r) for r in g] for g in responses], max_row_tokens)
    return len(widths), max(widths)


def _plan_rows(prompt_lengths: list[int], response_lengths: list[list[int]],
               max_row_tokens: int) -> tuple[list[list[int]], list[int]]:
    """:func:`pack_groups`' row rule on lengths: the row of each response (group by group) and each row's width. A
    row takes the next response of its group while it stays within ``max_row_tokens`` or holds no response tokens
    yet."""
    plan: list[list[int]] = []
    widths: list[int] = []
    for prompt_length, group in zip(prompt_lengths, response_lengths):
        rows_of_group: list[int] = []
        for length in group:
            if not rows_of_group or (widths[-1] + length > max_row_tokens and widths[-1] > prompt_length):
                widths.append(prompt_length)
            widths[-1] += length
            rows_of_group.append(len(widths) - 1)
        plan.append(rows_of_group)
    return plan, widths


def supports_packed(model: nn.Module) -> bool:
    """Whether ``model`` honours the custom 4D attention mask of :func:`pack_groups` (transformers' ``sdpa``
    attention does; ``flash_attention_2`` ignores such masks)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"


def attention_pair_cost(config: object) -> float | None:
    """The forward FLOPs of one attended (query, key) pair relative to those of one token position, per decoder
    layer: ``4 * heads * head_dim`` (its score and its share of the weighted values) over ``2 * p``, ``p`` the
    layer's matmul weights (query and output ``2 * h * heads * head_dim``, key and value ``2 * h * kv_heads *
    head_dim``, the gated MLP ``3 * h * intermediate``; a dense estimate). None when ``config`` (a transformers
    config) lacks these sizes."""
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    intermediate = getattr(config, "intermediate_size", None)
    if not (isinstance(hidden, int) and isinstance(heads, int) and isinstance(intermediate, int)):
        return None
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    weights = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate
    return 4 * heads * head_dim / (2 * weights)


def layout_cost(rows: int, width: int, pair_cost: float) -> float:
    """The forward cost, in token positions, of ``rows`` rows of ``width`` tokens with dense attention:
    ``rows * width * (1 + pair_cost * width)`` (``pair_cost`` from :func:`attention_pair_cost`). The output head
    is left out: it runs on the response tokens only, the same in every layout."""
    return rows * width * (1.0 + pair_cost * width)


def packed_token_logprobs(model: nn.Module, packed: PackedGroups, chunk_size: int = 4096) -> Tensor:
    """Log-probs ``[N]`` (fp32) of ``packed.targets``, computed on the shared-prefix rows.

    Equal, up to float rounding, to the target positions of :func:`token_logprobs` on the
    same responses in :func:`pack_sequences`' layout, in the same order.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _computation(model, "ggpo_packed_token_logprobs")(packed, chunk_size)


def chunked_packed_token_logprobs(model: nn.Module, packed: PackedGroups, chunk_size: int) -> Tensor:
    """``packed_token_logprobs`` without its argument check: the body once, the output head in chunks."""
    inputs = dict(input_ids=packed.input_ids, attention_mask=packed.attention, position_ids=packed.position_ids)
    parts = decoder_and_head(model)
    if parts is None:
        with _float32_attention_on_cpu(model):
            logits = model(**inputs, use_cache=False).logits  # [R, W, V]
        logits = logits.reshape(-1, logits.shape[-1])[packed.context]  # [N, V]
        logits = logits.to(logprob_dtype(logits.dtype))  # [N, V]
        return logits.log_softmax(-1).gather(-1, packed.targets.unsqueeze(-1)).squeeze(-1)
    body, head = parts
    with _float32_attention_on_cpu(model):
        hidden = _decoder_forward(body)(**inputs, use_cache=False).last_hidden_state  # [R, W, H]
    context = hidden.reshape(-1, hidden.shape[-1])[packed.context]  # [N, H]
    return _chunked_head_logprobs(head, context, packed.targets, chunk_size)


def _sdpa_float32(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  **kwargs) -> tuple[Tensor, Tensor | None]:
    """transformers' ``sdpa`` attention computed in float32 (float64 stays float64), its output cast back to the
    query's dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = logprob_dtype(query.dtype)
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.to(dtype), key.to(dtype), value.to(dtype),
                                              attention_mask, **kwargs)
    return out.to(query.dtype), weights


_SDPA_FLOAT32 = "ggpo_sdpa_float32"


@contextlib.contextmanager
def _float32_attention_on_cpu(model: nn.Module) -> Iterator[None]:
    """On CPU, the model's ``sdpa`` attention runs in float32 inside this context (a no-op in float32).

    PyTorch's CPU flash-attention kernel is several times slower in bf16 than in fp32,
    its backward especially (measured: 4.5 ms against 0.6 ms for ``[8, 4, 40, 32]``), so under
    bf16 autocast the attention of the log-prob forwards is computed in fp32: as fast as fp32
    and more precise than bf16. Not with gradient checkpointing, whose recomputation in
    backward runs outside this context and must see the same attention.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    on_cpu = next(model.parameters()).device.type == "cpu"
    checkpointing = getattr(base, "is_activation_checkpointing", None)  # transformers >= 5; older: the old name
    if checkpointing is None:
        checkpointing = getattr(base, "is_gradient_checkpointing", False)
    if not on_cpu or getattr(config, "_attn_implementation", None) != "sdpa" or checkpointing:
        yield
        return
    from transformers import AttentionInterface

    AttentionInterface.register(_SDPA_FLOAT32, _sdpa_float32)
    config._attn_implementation = _SDPA_FLOAT32
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def _chunked_head_logprobs(head: nn.Module, context: Tensor, targets: Tensor, chunk_size: int) -> Tensor:
    """``_head_logprobs`` over ``[N, H]`` states in chunks of ``chunk_size`` rows; ``[N]``."""
    chunks = []
    for start in range(0, targets.numel(), chunk_size):
        h, t = context[start:start + chunk_size], targets[start:start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            # recompute the chunk's logits in backward instead of keeping [chunk, V] alive
            chunks.append(checkpoint(_head_logprobs, head, h, t, use_reentrant=False))
        else:
            chunks.append(_head_logprobs(head, h, t))
    return torch.cat(chunks) if chunks else context.new_zeros(0, dtype=logprob_dtype(context.dtype))


def _head_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(head(hidden))[targets]`` in :func:`logprob_dtype`, shapes ``[N, H], [N] -> [N]``."""
    logits = head(hidden)  # [N, V]
    logits = logits.to(logprob_dtype(logits.dtype))  # [N, V]
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N]


DECODER_FORWARD = "ggpo_decoder_forward"
"""The attribute under which a decoder stack may carry what the log-prob forwards call instead of the stack itself
(the same arguments and outputs): its compiled forward (:mod:`ggpo_lightning.models.compiled`, ``model.compile``)."""


def _decoder_forward(body: nn.Module) -> Callable[..., Any]:
    """What the log-prob forwards call to run the decoder stack ``body``: its :data:`DECODER_FORWARD`, else itself."""
    return getattr(body, DECODER_FORWARD, body)


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """The transformer body and output head when logits are exactly ``head(body(x))``.

    Models that post-process logits (soft-capping, logit scaling) return None and take
    the plain forward path.
    """
    if hasattr(model, "get_base_model"):  # a peft wrapper: the transformers model inside, adapters in place
        model = model.get_base_model()
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    body = getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or head is None:
        return None
    return body, head


def token_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, target_mask: Tensor, chunk_size: int = 4096
) -> Tensor:
    """Log-probs of the tokens at ``target_mask`` positions, 0 elsewhere; ``[B, L]`` fp32.

    ``target_mask[:, 0]`` must be False (the first token has no context).
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != target_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"target_mask {tuple(target_mask.shape)} must have the same [B, L] shape"
        )
    if bool(target_mask[:, 0].any()):
        raise ValueError("target_mask[:, 0] must be False: the first token has no context to predict it from")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _computation(model, "ggpo_token_logprobs")(input_ids, attention_mask, target_mask, chunk_size)


def response_token_logprobs(model: nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                            chunk_size: int = 4096) -> list[list[float]]:
    """Each response token's log-prob under ``model`` given its prompt, by one forward over the pairs
    (the scoring pass that the rollout engines' sampling-time recording spares; kept for checks and benchmarks)."""
    device = next(model.parameters()).device
    input_ids, attention, target = pack_sequences(prompts, responses, pad_id, device)  # [B, L] each
    tokens = token_logprobs(model, input_ids, attention, target, chunk_size)  # [B, L]
    return [tokens[i][target[i]].tolist() for i in range(len(prompts))]


def chunked_token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, target_mask: Tensor,
                           chunk_size: int) -> Tensor:
    """``token_logprobs`` without its argument checks: the body once, the output head in chunks."""
    targets = input_ids[target_mask]  # [N]
    parts = decoder_and_head(model)
    if parts is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # [B, L, V]
        logits = logits[:, :-1].to(logprob_dtype(logits.dtype))  # [B, L-1, V]
        logp = logits.log_softmax(-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, L-1]
        flat = logp[target_mask[:, 1:]]  # [N]
    else:
        body, head = parts
        hidden = _decoder_forward(body)(input_ids=input_ids, attention_mask=attention_mask,
                                        use_cache=False).last_hidden_state  # [B, L, H]
        context = hidden[:, :-1][target_mask[:, 1:]]  # [N, H]: the state that predicts each target
        flat = _chunked_head_logprobs(head, context, targets, chunk_size)  # [N]
    return flat.new_zeros(input_ids.shape).masked_scatter(target_mask, flat)  # [B, L]


def sequence_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, target_mask: Tensor, chunk_size: int = 4096
) -> tuple[Tensor, Tensor]:
    """``(sequence log-probs [B], token log-probs [B, L])``: the sum over target tokens, and each."""
    tokens = token_logprobs(model, input_ids, attention_mask, target_mask, chunk_size)  # [B, L]
    return tokens.sum(-1), tokens


SHARDED_FORWARDS: dict[str, Callable[..., Tensor]] = {
    "ggpo_token_logprobs": chunked_token_logprobs,
    "ggpo_packed_token_logprobs": chunked_packed_token_logprobs,
}
"""The log-prob computations, by the attribute under which an FSDP2-sharded model carries each as a
registered forward method (``distributed.shard_decoder_layers``). They call the body and the output
head apart, never ``model.forward``; FSDP2 gathers the root's weights (embeddings, final norm, head)
only around the model's forwards, so each must be one of them."""


def _computation(model: nn.Module, name: str) -> Callable[..., Tensor]:
    """The computation ``name`` on ``model``: its registered forward when sharded, else the plain function."""
    method = getattr(model, name, None)
    return method if method is not None else functools.partial(SHARDED_FORWARDS[name], model)
