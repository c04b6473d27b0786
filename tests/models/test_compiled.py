"""``model.compile``: the width buckets, padding that leaves every log-prob and gradient as it was (checked without
compiling: the padding is a function of its own), and the refusals."""

from __future__ import annotations

import types

import pytest
import torch

from ggpo_lightning.core.logprobs import (DECODER_FORWARD, decoder_and_head, pack_groups, pack_sequences,
                                          packed_token_logprobs, token_logprobs)
from ggpo_lightning.models.compiled import SHARDED_ERROR, bucket_width, compile_errors, padded_forward
from ggpo_lightning.records.errors import SettingsError


def test_bucket_widths_are_few_and_pad_little():
    assert [bucket_width(w) for w in (1, 33, 35, 64, 129, 262, 500, 513, 1024, 1025, 1060, 2049, 4096)] == \
        [8, 40, 40, 64, 144, 288, 512, 576, 1024, 1152, 1152, 2304, 4096]
    widths = {bucket_width(w) for w in range(1, 4097)}
    assert len(widths) == 56  # 16 up to 128, 8 per doubling above
    assert all(bucket_width(w) - w < max(8, w / 8) for w in range(1, 4097))


def _padded_eagerly(model) -> None:
    """``model``'s log-prob forwards on bucket-padded rows, its decoder stack not compiled."""
    body, _ = decoder_and_head(model)
    setattr(body, DECODER_FORWARD, types.MethodType(padded_forward(lambda b, **inputs: b(**inputs)), body))


def _groups(tok):
    prompts = [tok("1+2=")["input_ids"], tok("7+8=")["input_ids"]]
    responses = [[tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                  tok("12", add_special_tokens=False)["input_ids"]],
                 [tok("15", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], []]]
    return prompts, responses


def _values_and_grads(model, compute):
    model.zero_grad()
    values = compute()
    values.sum().backward()
    return values.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("layout", ["padded", "shared_prefix"])
def test_bucket_padding_leaves_logprobs_and_gradients_unchanged(tiny_lm, layout):
    """Rows padded from their width (under 16) to 32: the same log-probs and gradients, fp32, to 1e-5, in the padded
    layout (2D mask) and the shared-prefix one (4D mask grown with masked columns and self-attending padding)."""
    model, tok = tiny_lm
    prompts, responses = _groups(tok)
    if layout == "padded":
        rows = pack_sequences([p for p, rs in zip(prompts, responses) for _ in rs],
                              [r for rs in responses for r in rs], tok.pad_token_id)
        compute = lambda: token_logprobs(model, *rows, chunk_size=3)  # noqa: E731  [B, L]
    else:
        packed = pack_groups(prompts, responses, tok.pad_token_id)
        compute = lambda: packed_token_logprobs(model, packed, chunk_size=3)  # noqa: E731  [N]
    expected, expected_grads = _values_and_grads(model, compute)
    _padded_eagerly(model)
    got, grads = _values_and_grads(model, compute)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_compile_refusals_name_the_key(monkeypatch):
    assert compile_errors(False, sharded=True) == []
    assert compile_errors(True, sharded=False) == []
    assert compile_errors(True, sharded=True) == [SHARDED_ERROR]
    monkeypatch.setattr("shutil.which", lambda name: None)
    (error,) = compile_errors(True, sharded=False)
    assert error.startswith("model.compile: true needs a C++ compiler")


def test_module_refuses_compile_without_a_compiler_before_loading(monkeypatch):
    from ggpo_lightning.training.settings import check_model_settings

    check_model_settings({"compile": True})
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(SettingsError, match="model.compile: true needs a C\\+\\+ compiler"):
        check_model_settings({"compile": True})


def test_ggpo_train_refuses_compile_with_fsdp_before_anything_loads(tmp_path, monkeypatch):
    from pathlib import Path

    from ggpo_lightning.cli.train import run_training

    monkeypatch.chdir(tmp_path)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "fsdp-cpu-2proc.yaml"
    with pytest.raises(SettingsError, match="model.compile: true is not supported with a sharding strategy"):
        run_training(["--config", str(recipe), "--model.compile", "true", "--tiny_model", "null",
                      "--synthetic_data", "null", "--model.model_name_or_path", str(tmp_path / "no-model")])


def test_compile_decoder_keeps_weights_and_forward_and_deep_copies_bind_to_themselves(tiny_lm):
    """Nothing compiles until a log-prob forward runs: the state dict and ``forward`` (generation's) are the model's
    own, and a deep copy (the reference, an engine's copy) carries the compiled forward bound to its own stack."""
    import copy

    from ggpo_lightning.models.compiled import compile_decoder

    model, _ = tiny_lm
    keys, forward = list(model.state_dict()), model.forward
    compile_decoder(model)
    assert list(model.state_dict()) == keys and model.forward == forward
    twin = copy.deepcopy(model)
    body, twin_body = decoder_and_head(model)[0], decoder_and_head(twin)[0]
    assert getattr(body, DECODER_FORWARD).__self__ is body
    assert getattr(twin_body, DECODER_FORWARD).__self__ is twin_body
