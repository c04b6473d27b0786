"""The HF engine's decoding before issue 42's rewrite (item 3), kept as the reference the new loop must match:
``sample_responses`` and its ``_decode`` as they were, on transformers' ``DynamicCache``, dropping finished rows at
every step and reading back to the host at every token. Only the tests use it."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LogitsProcessorList

from ggpo_lightning.rollouts.hf.engine import _cache_of, _warpers


@torch.no_grad()
def reference_sample_responses(model: nn.Module, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                               n: int = 1, record_logprobs: bool = False, do_sample: bool = True,
                               temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                               ) -> tuple[list[list[int]], list[list[float]] | None]:
    """``sample_responses`` before the rewrite (without its ``synced_gpus`` path, which did not change)."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # [G, P]
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    cache: dict[str, Any] = {}  # the prompts' key-value cache as the model takes it, when computed up front
    if n > 1 and width > 1 and getattr(model.config, "use_cache", True):
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded prompts
        out = model(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1],
                    use_cache=True)
        cache = _cache_of(out)
        next(iter(cache.values())).batch_repeat_interleave(n)  # [G * n, ...]: decoding goes on from the last token
    input_ids, attention = input_ids.repeat_interleave(n, 0), attention.repeat_interleave(n, 0)  # [G * n, P]
    warpers = _warpers(temperature, top_p, top_k) if do_sample else None
    sampled, logprobs = _reference_decode(model, input_ids, attention, cache, max_new_tokens, pad, eos,
                                          record_logprobs, warpers)
    lengths = [seq.index(eos) + 1 if eos in seq else len(seq) for seq in sampled]
    responses = [seq[:length] for seq, length in zip(sampled, lengths)]
    if logprobs is None:
        return responses, None
    return responses, [row[:length] for row, length in zip(logprobs, lengths)]


def _reference_decode(model: nn.Module, input_ids: Tensor, attention: Tensor, cache: dict[str, Any],
                      max_new_tokens: int, pad: int, eos: int, record_logprobs: bool,
                      warpers: LogitsProcessorList | None) -> tuple[list[list[int]], list[list[float]] | None]:
    """Token-by-token decoding on a key-value cache from which finished rows are dropped (the loop before issue 42's
    rewrite, verbatim)."""
    batch = input_ids.shape[0]
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [B, P] as generate numbers left-padded prompts
    keep_logits = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    if cache:  # the prompts' last token, on their cache
        out = model(input_ids=input_ids[:, -1:], attention_mask=attention, position_ids=positions[:, -1:],
                    use_cache=True, **cache, **keep_logits)
    else:  # the prompts whole
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                    **keep_logits)
    cache = _cache_of(out)
    droppable = hasattr(next(iter(cache.values())), "batch_select_indices")
    tokens = input_ids.new_full((batch, max_new_tokens), pad)  # [B, T]
    logprobs = torch.zeros((batch, max_new_tokens)) if record_logprobs else None  # [B, T]
    rows = torch.arange(batch, device=input_ids.device)  # [b] each batch row's response
    going = torch.ones(batch, dtype=torch.bool, device=input_ids.device)  # [b] not finished (without dropping)
    position = positions[:, -1]  # [b]
    for t in range(max_new_tokens):
        logits = out.logits[:, -1, :].float()  # [b, V]
        if warpers is None:
            chosen = logits.argmax(-1)  # [b]
        else:  # drawn over all B rows, as generate does: row i's draw depends on row i's probabilities only,
            # so the responses are generate's own for the same seed (finished rows get a placeholder distribution)
            probs = logits.new_ones((batch, logits.shape[1]))  # [B, V]
            probs[rows] = torch.softmax(warpers(None, logits), dim=-1)
            chosen = torch.multinomial(probs, 1).squeeze(1)[rows]  # [b]
        tokens[rows[going], t] = chosen[going]
        if logprobs is not None:
            picked = torch.log_softmax(logits, -1).gather(1, chosen[:, None]).squeeze(1)  # [b]
            logprobs[rows[going].cpu(), t] = picked[going].cpu()
        going = going & (chosen != eos)  # [b]
        if t + 1 == max_new_tokens or not bool(going.any()):
            break
        if droppable and not bool(going.all()):  # finished rows leave the batch and the cache
            keep = going.nonzero().squeeze(1)  # [b']
            next(iter(cache.values())).batch_select_indices(keep)
            rows, chosen, attention, position, going = rows[keep], chosen[keep], attention[keep], position[keep], \
                going[keep]
        attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)  # [b, P + t + 1]
        position = position + 1  # [b]
        out = model(input_ids=chosen[:, None], attention_mask=attention, position_ids=position[:, None],
                    use_cache=True, **cache)
        cache = _cache_of(out)
    return tokens.tolist(), None if logprobs is None else logprobs.tolist()
