"""Chunked log-probs equal the plain full-vocabulary computation, and shared-prefix rows equal padded rows,
values and gradients: compared in float64 (the ``float64`` fixture), where two orders of the same sums agree within
``FLOAT64_TOLERANCE`` whatever the CPU's kernels."""

from __future__ import annotations

import pytest
import torch

from ggpo_lightning.core.logprobs import (pack_groups, pack_sequences, packed_token_logprobs, sequence_logprobs,
                                    supports_packed, token_logprobs)

from float64_models import FLOAT64_TOLERANCE


def reference_token_logprobs(model, input_ids, attention_mask, target_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, L, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [B, L, V]
    logp = logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    out = torch.zeros(input_ids.shape, dtype=logp.dtype)  # [B, L]
    out[:, 1:] = torch.where(target_mask[:, 1:], logp, 0.0)
    return out


@pytest.fixture()
def batch(tiny_lm):
    _, tok = tiny_lm
    prompts = [tok("1+2=")["input_ids"], tok("7+8=")["input_ids"], tok("3+3=")["input_ids"]]
    responses = [tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                 tok("15", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                 tok("612", add_special_tokens=False)["input_ids"]]
    return pack_sequences(prompts, responses, tok.pad_token_id)


def test_pack_sequences_layout(tiny_lm, batch):
    _, tok = tiny_lm
    input_ids, attention, target = batch
    assert input_ids.shape == (3, 8)  # <bos> 3 + 3 + eos... longest row: 5 prompt + 3 response
    assert target.sum(-1).tolist() == [2, 3, 3]
    assert attention.sum(-1).tolist() == [7, 8, 8]
    assert not target[:, 0].any()
    assert input_ids[0, 7].item() == tok.pad_token_id  # right padding


@pytest.mark.parametrize("chunk_size", [1, 3, 4096])
def test_chunked_equals_full_vocabulary_values_and_gradients(tiny_lm, batch, float64, chunk_size):
    model = float64(tiny_lm[0])
    input_ids, attention, target = batch
    expected = reference_token_logprobs(model, input_ids, attention, target)
    (expected.sum() * 1.0).backward()
    grads_expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = token_logprobs(model, input_ids, attention, target, chunk_size=chunk_size)
    got.sum().backward()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, **FLOAT64_TOLERANCE)
    for g, e in zip((p.grad for p in model.parameters()), grads_expected):
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)
    assert torch.all(got[~target] == 0) and torch.all(got[target] < 0)


def test_sequence_logprobs_is_the_sum_over_response_tokens(tiny_lm, batch):
    model, _ = tiny_lm
    with torch.no_grad():
        seq, tokens = sequence_logprobs(model, *batch)
    torch.testing.assert_close(seq, tokens.sum(-1))
    assert seq.shape == (3,)


def test_padding_does_not_change_a_rows_logprobs(tiny_lm, batch, float64):
    model = float64(tiny_lm[0])
    input_ids, attention, target = batch
    with torch.no_grad():
        together = token_logprobs(model, input_ids, attention, target)
        alone = token_logprobs(model, input_ids[:1, :7], attention[:1, :7], target[:1, :7])
    torch.testing.assert_close(together[0, :7], alone[0], **FLOAT64_TOLERANCE)


def test_bad_input(tiny_lm, batch):
    model, _ = tiny_lm
    input_ids, attention, target = batch
    bad = target.clone()
    bad[0, 0] = True
    with pytest.raises(ValueError, match="first token"):
        token_logprobs(model, input_ids, attention, bad)
    with pytest.raises(ValueError, match="same"):
        token_logprobs(model, input_ids, attention[:, :3], target)
    with pytest.raises(ValueError, match="at least one token"):
        pack_sequences([[]], [[1]], 0)


def _groups(tok):
    """Two prompt groups of uneven responses (one empty), as token ids."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [tok("1+2=")["input_ids"], tok("17+8=")["input_ids"]]
    responses = [[enc("3") + [tok.eos_token_id], enc("4"), enc("1234567")],
                 [enc("25") + [tok.eos_token_id], [], enc("9"), enc("26")]]
    return prompts, responses


def test_pack_groups_layout(tiny_lm):
    _, tok = tiny_lm
    prompts, responses = _groups(tok)
    packed = pack_groups(prompts, responses, tok.pad_token_id)
    lengths = [len(p) + sum(len(r) for r in rs) for p, rs in zip(prompts, responses)]
    assert packed.input_ids.shape == (2, max(lengths))  # one row per group: one prompt copy each
    assert packed.targets.tolist() == [t for rs in responses for r in rs for t in r]
    row = packed.input_ids[0, :lengths[0]].tolist()
    assert row == prompts[0] + [t for r in responses[0] for t in r]
    # the third response restarts its positions after the prompt and sees the prompt, not the other responses
    p, start = len(prompts[0]), len(prompts[0]) + 3
    assert packed.position_ids[0, start:start + 7].tolist() == list(range(p, p + 7))
    assert packed.attention[0, 0, start, :p].all() and not packed.attention[0, 0, start, p:start].any()


@pytest.mark.parametrize("max_row_tokens", [512, 8, 1])
def test_shared_prefix_rows_equal_padded_rows_values_and_gradients(tiny_lm, float64, max_row_tokens):
    model, tok = tiny_lm
    model = float64(model)
    prompts, responses = _groups(tok)
    rows = pack_sequences([p for p, rs in zip(prompts, responses) for _ in rs],
                          [r for rs in responses for r in rs], tok.pad_token_id)
    expected = token_logprobs(model, *rows)[rows[2]]  # [N]
    expected.sum().backward()
    grads_expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    packed = pack_groups(prompts, responses, tok.pad_token_id, max_row_tokens=max_row_tokens)
    got = packed_token_logprobs(model, packed, chunk_size=3)
    got.sum().backward()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, **FLOAT64_TOLERANCE)
    for g, e in zip((p.grad for p in model.parameters()), grads_expected):
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)
    if max_row_tokens == 1:  # every (non-empty) response in a row of its own, each with its prompt copy
        assert packed.input_ids.shape[0] == sum(len(r) > 0 for rs in responses for r in rs)


def test_shared_prefix_needs_sdpa_attention(tiny_lm):
    model, _ = tiny_lm
    assert supports_packed(model)
    model.config._attn_implementation = "flash_attention_2"  # ignores custom 4D masks
    assert not supports_packed(model)


def test_shared_prefix_attention_runs_in_float32_on_cpu_and_is_restored(tiny_lm):
    model, tok = tiny_lm
    prompts, responses = _groups(tok)
    packed = pack_groups(prompts, responses, tok.pad_token_id)
    exact = packed_token_logprobs(model, packed)  # fp32: float32 attention is the same computation
    assert model.config._attn_implementation == "sdpa"  # restored after the forward
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = packed_token_logprobs(model, packed)
    mixed.sum().backward()
    torch.testing.assert_close(mixed, exact, rtol=0.0, atol=0.1)  # bf16 matmuls, fp32 attention
    assert model.config._attn_implementation == "sdpa"
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_no_forward_keeps_a_key_value_cache(tiny_lm, batch):
    """transformers builds a cache unless told not to; in a no-gradient forward (reference, the first pass of a
    micro-batched step) it would hold every layer's keys and values until the forward returns."""
    model, tok = tiny_lm
    caches = []

    def record(module, args, kwargs, output):
        caches.append(output.get("cache", output.get("past_key_values")))

    handle = model.model.register_forward_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            token_logprobs(model, *batch)
            packed = pack_groups([tok("1+2=")["input_ids"]], [[tok("3", add_special_tokens=False)["input_ids"]] * 2],
                                 tok.pad_token_id)
            packed_token_logprobs(model, packed)
    finally:
        handle.remove()
    assert caches == [None, None]
    with torch.no_grad():  # the check can fail: the same body returns a cache by default
        out = model.model(input_ids=batch[0])
    assert out.get("cache", out.get("past_key_values")) is not None
