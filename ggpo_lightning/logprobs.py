"""Per-token and per-sequence log-probabilities of responses under a causal LM.

Layout: each row of ``input_ids`` ``[B, L]`` is ``prompt + response`` (right-padded),
``target_mask`` ``[B, L]`` is True at the positions of response tokens. The log-prob
of the token at position ``p`` comes from the logits at ``p - 1``.

Only response positions go through the output head, in chunks of ``chunk_size``
tokens, each chunk under activation checkpointing when gradients are on. So neither
the forward nor the backward holds the full fp32 ``[B, L, V]`` logits: the peak is
``chunk_size x V`` floats, whatever the batch and vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["SHARDED_FORWARD", "chunked_token_logprobs", "pack_sequences", "sequence_logprobs", "token_logprobs"]

SHARDED_FORWARD = "ggpo_token_logprobs"
"""Attribute under which an FSDP2-sharded model carries ``chunked_token_logprobs`` as a registered
forward method (``distributed.shard_decoder_layers``). The computation calls the body and the
output head separately, never ``model.forward``; FSDP2 gathers the root's weights (embeddings,
final norm, head) only around the model's forwards, so it must be one of them."""


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


def _head_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(head(hidden))[targets]`` in fp32, shapes ``[N, H], [N] -> [N]``."""
    logits = head(hidden).float()  # [N, V]
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N]


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
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
    sharded_forward = getattr(model, SHARDED_FORWARD, None)
    if sharded_forward is not None:
        return sharded_forward(input_ids, attention_mask, target_mask, chunk_size)
    return chunked_token_logprobs(model, input_ids, attention_mask, target_mask, chunk_size)


def chunked_token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, target_mask: Tensor,
                           chunk_size: int) -> Tensor:
    """``token_logprobs`` without its argument checks: the body once, the output head in chunks."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)  # [B, L]
    targets = input_ids[target_mask]  # [N]
    parts = _decoder_and_head(model)
    if parts is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # [B, L-1, V]
        logp = logits.float().log_softmax(-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return out.masked_scatter(target_mask, logp[target_mask[:, 1:]])
    body, head = parts
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
    context = hidden[:, :-1][target_mask[:, 1:]]  # [N, H]: the state that predicts each target
    chunks = []
    for start in range(0, targets.numel(), chunk_size):
        h, t = context[start:start + chunk_size], targets[start:start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            # recompute the chunk's logits in backward instead of keeping [chunk, V] alive
            chunks.append(checkpoint(_head_logprobs, head, h, t, use_reentrant=False))
        else:
            chunks.append(_head_logprobs(head, h, t))
    if not chunks:
        return out
    return out.masked_scatter(target_mask, torch.cat(chunks))


def sequence_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, target_mask: Tensor, chunk_size: int = 4096
) -> tuple[Tensor, Tensor]:
    """``(sequence log-probs [B], token log-probs [B, L])``: the sum over target tokens, and each."""
    tokens = token_logprobs(model, input_ids, attention_mask, target_mask, chunk_size)  # [B, L]
    return tokens.sum(-1), tokens
