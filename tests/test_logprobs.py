"""Chunked log-probs equal the plain full-vocabulary computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from ggpo_lightning.logprobs import pack_sequences, sequence_logprobs, token_logprobs


def reference_token_logprobs(model, input_ids, attention_mask, target_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()  # [B, L, V]
    logp = logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    out = torch.zeros(input_ids.shape)
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
def test_chunked_equals_full_vocabulary_values_and_gradients(tiny_lm, batch, chunk_size):
    model, _ = tiny_lm
    input_ids, attention, target = batch
    expected = reference_token_logprobs(model, input_ids, attention, target)
    (expected.sum() * 1.0).backward()
    grads_expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = token_logprobs(model, input_ids, attention, target, chunk_size=chunk_size)
    got.sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for g, e in zip((p.grad for p in model.parameters()), grads_expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    assert torch.all(got[~target] == 0) and torch.all(got[target] < 0)


def test_sequence_logprobs_is_the_sum_over_response_tokens(tiny_lm, batch):
    model, _ = tiny_lm
    with torch.no_grad():
        seq, tokens = sequence_logprobs(model, *batch)
    torch.testing.assert_close(seq, tokens.sum(-1))
    assert seq.shape == (3,)


def test_padding_does_not_change_a_rows_logprobs(tiny_lm, batch):
    model, _ = tiny_lm
    input_ids, attention, target = batch
    with torch.no_grad():
        together = token_logprobs(model, input_ids, attention, target)
        alone = token_logprobs(model, input_ids[:1, :7], attention[:1, :7], target[:1, :7])
    torch.testing.assert_close(together[0, :7], alone[0], rtol=1e-5, atol=1e-6)


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
