"""HFGenerateEngine: a private behavior copy, grouped sampling, EOS handling, weight sync."""

from __future__ import annotations

import pytest
import torch

from ggpo_lightning.core.logprobs import response_token_logprobs
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.hf import engine as hf_engine
from ggpo_lightning.rollouts.protocol import RolloutEngine
from ggpo_lightning.rollouts.hf.engine import (COMPACT_BELOW, STOP_CHECK_EVERY, HFGenerateEngine, generate_responses,
                                              sample_responses)


def params_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_engine_samples_k_responses_per_prompt_in_order(tiny_lm):
    model, tok = tiny_lm
    engine = HFGenerateEngine(model, tok)
    assert isinstance(engine, RolloutEngine)
    prompts = [tok("1+2=")["input_ids"], tok("4+4=")["input_ids"], tok("9+")["input_ids"]]
    torch.manual_seed(0)
    # generation_batch_size 5 with K=4: one whole group per call
    out = engine.generate(prompts, 4, SamplingConfig(max_new_tokens=6, generation_batch_size=5))
    assert [g.prompt_ids for g in out] == prompts
    for g in out:
        assert len(g.response_ids) == len(g.responses) == 4
        for ids, text in zip(g.response_ids, g.responses):
            assert 1 <= len(ids) <= 6
            assert tok.eos_token_id not in ids[:-1]  # cut right after the first EOS
            assert text == tok.decode(ids, skip_special_tokens=True)
        assert g.token_logprobs is None


def test_engine_is_a_private_copy_synced_by_load_weights(tiny_lm):
    model, tok = tiny_lm
    engine = HFGenerateEngine(model, tok)
    assert engine.model is not model and params_equal(engine.model, model)
    with torch.no_grad():
        next(model.parameters()).add_(0.5)
    assert not params_equal(engine.model, model)
    engine.load_weights(model, version=7)
    assert params_equal(engine.model, model) and engine.version == 7
    assert not any(p.requires_grad for p in engine.model.parameters())


def test_bf16_engine_for_the_mismatch_setting(tiny_lm):
    model, tok = tiny_lm
    engine = HFGenerateEngine(model, tok, dtype=torch.bfloat16)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32
    out = engine.generate([tok("1+1=")["input_ids"]], 2, SamplingConfig(max_new_tokens=3))
    assert len(out[0].response_ids) == 2
    engine.load_weights(model, version=1)  # casts into the engine's precision
    assert next(engine.model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("kwargs, match", [(dict(temperature=0.0), "temperature"), (dict(top_p=1.5), "top_p"),
                                           (dict(max_new_tokens=0), "max_new_tokens")])
def test_sampling_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_a_shared_engine_samples_what_a_synced_copy_samples(tiny_lm):
    model, tok = tiny_lm
    model.train()
    shared, private = HFGenerateEngine(model, tok, share=True), HFGenerateEngine(model, tok)
    assert shared.model is model
    prompts = [tok("1+2=")["input_ids"], tok("4+4=")["input_ids"]]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.3)
    outs = []
    for engine in (shared, private):
        torch.manual_seed(0)
        outs.append([g.response_ids for g in engine.generate(prompts, 3, sampling)])
    assert outs[0] == outs[1]
    assert model.training and all(p.requires_grad for p in model.parameters())  # the learner is left as it was
    shared.load_weights(model, version=3)
    assert shared.version == 3
    with pytest.raises(ValueError, match="shared engine"):
        shared.load_weights(private.model, version=4)
    with pytest.raises(ValueError, match="dtype"):
        HFGenerateEngine(model, tok, dtype=torch.bfloat16, share=True)


def test_a_prompt_prefix_computed_once_per_group_gives_the_same_responses(tiny_lm):
    model, tok = tiny_lm
    prompts = [tok("1+2=")["input_ids"], tok("14+4=")["input_ids"], tok("9")["input_ids"]]  # left padding too
    shared = generate_responses(model, tok, prompts, 6, n=3, do_sample=False)
    alone = generate_responses(model, tok, [p for p in prompts for _ in range(3)], 6, do_sample=False)
    assert shared == alone
    # sampling: the logits of every step match, so with one seed the same draws come out
    torch.manual_seed(1)
    shared = generate_responses(model, tok, prompts, 6, n=3, do_sample=True, temperature=1.0, top_k=0)
    torch.manual_seed(1)
    alone = generate_responses(model, tok, [p for p in prompts for _ in range(3)], 6, do_sample=True,
                               temperature=1.0, top_k=0)
    assert shared == alone


@pytest.mark.parametrize("n, temperature, top_p", [(1, 1.0, 1.0), (3, 0.7, 0.9), (4, 1.3, 1.0)])
def test_log_probs_recorded_while_sampling_equal_a_scoring_forward(tiny_lm, n, temperature, top_p):
    """The behavior log-probs come from the sampling pass itself (no second forward) and are the model's own
    distribution: the warpers (temperature, top-p) change what is drawn, not what is recorded; left-padded prompts
    and the shared prompt prefix (n > 1) included."""
    model, tok = tiny_lm
    prompts = [tok("1+2=")["input_ids"], tok("14+4=")["input_ids"], tok("9")["input_ids"]]
    engine = HFGenerateEngine(model, tok, record_logprobs=True)
    torch.manual_seed(3)
    out = engine.generate(prompts, n, SamplingConfig(max_new_tokens=7, temperature=temperature, top_p=top_p))
    lengths = {len(ids) for g in out for ids in g.response_ids}
    assert len(lengths) > 1  # some responses stopped at EOS before others: the padded tail is cut off
    for g in out:
        expected = response_token_logprobs(model, [g.prompt_ids] * n, g.response_ids, tok.pad_token_id)
        for got, want in zip(g.token_logprobs, expected):
            assert len(got) == len(want)
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=2e-5)


def test_sampling_without_recording_returns_no_log_probs_and_the_same_responses(tiny_lm):
    model, tok = tiny_lm
    prompts = [tok("1+2=")["input_ids"], tok("14+4=")["input_ids"]]
    torch.manual_seed(5)
    plain = sample_responses(model, tok, prompts, 6, n=2, do_sample=True, top_k=0)
    torch.manual_seed(5)
    recorded = sample_responses(model, tok, prompts, 6, n=2, record_logprobs=True, do_sample=True, top_k=0)
    assert plain.logprobs is None and plain.responses == recorded.responses  # recording leaves the draws alone
    assert [len(lp) for lp in recorded.logprobs] == [len(r) for r in recorded.responses]
    assert all(x <= 0 for lp in recorded.logprobs for x in lp)
    assert plain.versions is None and recorded.versions is None  # no hook: no tags


def _hf_generate(model, tok, prompts, max_new_tokens, **decoding):
    """transformers' own ``generate`` on the same left-padded prompts: the reference decoding."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **decoding)
    return [seq[: seq.index(tok.eos_token_id) + 1] if tok.eos_token_id in seq else seq
            for seq in out[:, width:].tolist()]


def test_greedy_decoding_equals_transformers_generate(tiny_lm):
    model, tok = tiny_lm
    prompts = [tok("1+2=")["input_ids"], tok("14+4=")["input_ids"], tok("9")["input_ids"], tok("7+7=")["input_ids"]]
    expected = _hf_generate(model, tok, prompts, 9, do_sample=False)
    assert len({len(r) for r in expected}) > 1  # rows stop at different steps: finished rows are dropped
    assert generate_responses(model, tok, prompts, 9, do_sample=False) == expected
    repeated = generate_responses(model, tok, prompts, 9, n=2, do_sample=False)  # on the shared prompt cache
    assert repeated == [r for r in expected for _ in range(2)]


def test_sampling_gives_transformers_generate_responses_for_the_same_seed(tiny_lm):
    """The same warpers in generate's order (temperature, top-k, top-p) and the same draws (one multinomial over
    every row, finished ones included): generate's responses, although finished rows leave our batch."""
    model, tok = tiny_lm
    prompts = [tok(f"{a}+{b}=")["input_ids"] for a, b in [(1, 2), (13, 4), (9, 9), (5, 60)]] * 4
    for settings in (dict(temperature=0.6, top_p=0.8, top_k=0), dict(temperature=1.4, top_p=1.0, top_k=5)):
        torch.manual_seed(11)
        ours = generate_responses(model, tok, prompts, 9, do_sample=True, **settings)
        torch.manual_seed(11)
        expected = _hf_generate(model, tok, prompts, 9, do_sample=True, **settings)
        assert len({len(r) for r in expected}) > 1  # some rows finished early and left our batch
        assert ours == expected


def test_the_rows_are_looked_at_every_step_on_the_cpu_and_every_few_on_an_accelerator():
    assert hf_engine._stop_check_every(torch.device("cpu")) == 1
    assert hf_engine._stop_check_every(torch.device("cuda", 0)) == STOP_CHECK_EVERY > 1


@pytest.mark.parametrize("every", [1, STOP_CHECK_EVERY], ids=["cpu", "accelerator"])
def test_finished_rows_leave_the_batch_at_the_stop_checks(tiny_lm, monkeypatch, every):
    """The prompts run once per prompt, then every step feeds the whole batch until a stop check (every step on the
    CPU, every STOP_CHECK_EVERY steps on an accelerator) finds fewer than COMPACT_BELOW of its rows going and drops
    the others; decoding ends at the first check with none going."""
    monkeypatch.setattr(hf_engine, "_stop_check_every", lambda device: every)
    model, tok = tiny_lm
    prompts = [tok(text)["input_ids"] for text in ("1+2=", "+", "9", "+++", "14+4=", "7+7=", "+ +", "5")]
    rows_per_forward = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: rows_per_forward.append(
        kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        responses = generate_responses(model, tok, prompts, 30, n=2, do_sample=False)
    finally:
        handle.remove()
    ends = [len(r) - 1 if r[-1] == tok.eos_token_id else 30 for r in responses]  # the step each row stopped after
    expected, batch = [len(prompts)], len(responses)
    for t in range(29):
        if (t + 1) % every == 0:
            going = sum(end > t for end in ends)
            if going == 0:
                break
            if going < COMPACT_BELOW * batch:
                batch = going
        expected.append(batch)
    assert rows_per_forward == expected
    assert len(prompts) * 2 > min(expected[1:]) > 0  # rows were dropped, and others went on
