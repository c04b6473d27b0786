"""The HF engine's decoding loop (issue 42, item 3): a preallocated cache, no read-back per token, the same responses
as the loop before it; the per-step hook for in-flight weight updates (issue 43) and its version tags."""

from __future__ import annotations

import copy

import pytest
import torch
from reference_decode import reference_sample_responses
from weight_swap import final_norm_changed

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.hf import engine as hf_engine
from ggpo_lightning.rollouts.hf.engine import (STOP_CHECK_EVERY, HFGenerateEngine, generate_responses,
                                              sample_responses)

LOGPROB_ATOL = 1e-5
"""fp32: the new loop attends over its whole preallocated cache (masked) and runs the prompts once per group, so its
sums run in another order than the old loop's; the log-probs agree to rounding."""


@pytest.fixture(params=["tiny", "qwen3"])
def lm(request, tiny_model_dir, qwen3_model_dir):
    """The tiny Llama test model (trained: stops at EOS early, at different steps) and the Qwen3-shaped one (random
    weights: runs long)."""
    from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer

    folder = tiny_model_dir if request.param == "tiny" else qwen3_model_dir
    return load_causal_lm(folder, dtype="float32").eval(), load_tokenizer(folder)


def _ragged_prompts(tok) -> list[list[int]]:
    return [tok(text)["input_ids"] for text in ("1+2=", "14+4=", "9", "+", "7+7=", "5+60=")]  # "+": long


@pytest.mark.parametrize("decoding", [dict(do_sample=False), dict(do_sample=True, temperature=1.0),
                                      dict(do_sample=True, temperature=0.7, top_p=0.9),
                                      dict(do_sample=True, temperature=1.4, top_k=5)],
                         ids=["greedy", "t1", "t0.7-p0.9", "t1.4-k5"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("record_logprobs", [False, True])
@pytest.mark.parametrize("every", [1, STOP_CHECK_EVERY], ids=["cpu", "accelerator"])
def test_the_new_loop_gives_the_old_loops_responses_for_a_seed(lm, decoding, n, record_logprobs, every, monkeypatch):
    """Token ids identical and log-probs within LOGPROB_ATOL, sampled and greedy, one response per prompt or a
    group sharing its prompt, ragged prompts; past several stop checks, so rows are dropped on the way; with the
    CPU's look at every step and an accelerator's every STOP_CHECK_EVERY (steps after the last row stopped)."""
    monkeypatch.setattr(hf_engine, "_stop_check_every", lambda device: every)
    model, tok = lm
    prompts = _ragged_prompts(tok)
    results, streams = [], []
    for sample in (reference_sample_responses, sample_responses):
        torch.manual_seed(7)
        results.append(sample(model, tok, prompts, 20, n=n, record_logprobs=record_logprobs, **decoding))
        streams.append(torch.get_rng_state())
    (old, old_logprobs), new = results
    assert new.responses == old and new.versions is None
    # the random stream is left where the old loop left it: the next rollout of a run draws the same
    assert torch.equal(streams[0], streams[1])
    assert len(old) == len(prompts) * n
    if record_logprobs:
        for got, want in zip(new.logprobs, old_logprobs):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=LOGPROB_ATOL)
    else:
        assert new.logprobs is None


def test_a_hook_swapping_weights_at_step_3_gives_old_then_new_tokens_and_their_versions(tiny_lm):
    """Tokens 0-2 are the old model's greedy ones, the later ones the new model's greedy continuation of the prompt
    and those three; rows that reached step 3 are tagged [v, v + 1], rows finished before [v, v]."""
    model, tok = tiny_lm
    old_model, new_model = copy.deepcopy(model), final_norm_changed(model, seed=0)
    prompts = [tok(text)["input_ids"] for text in ("1+2=", "+", "9", "+++", "14+4=")]  # "+": long answers
    steps = []

    def swap_at_3(t: int) -> int | None:
        steps.append(t)
        if t == 3:
            model.load_state_dict(new_model.state_dict())
            return 5
        return None

    swapped = sample_responses(model, tok, prompts, 12, n=2, do_sample=False, before_step=swap_at_3, version=4)
    assert steps == list(range(12))
    old = generate_responses(old_model, tok, prompts, 12, do_sample=False)
    reached = [len(r) > 3 for r in swapped.responses]
    assert any(reached) and not all(reached)  # some rows stopped before the swap
    for i, (response, versions) in enumerate(zip(swapped.responses, swapped.versions)):
        prompt, before = prompts[i // 2], old[i // 2]
        assert response[:3] == before[:3]
        if len(response) > 3:
            assert response[3:] == generate_responses(new_model, tok, [prompt + before[:3]], 9, do_sample=False)[0]
            assert response != before  # the new weights did change the continuation
            assert versions == [4, 5]
        else:
            assert versions == [4, 4]


def test_the_engine_tags_responses_with_versions_when_a_hook_is_set(tiny_lm):
    model, tok = tiny_lm
    engine = HFGenerateEngine(model, tok)
    engine.version = 5
    prompts = _ragged_prompts(tok)
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.2)
    assert all(g.versions is None for g in engine.generate(prompts, 2, sampling))  # no hook: the call's version
    new_weights = final_norm_changed(model, seed=1).state_dict()
    engine.before_step = lambda t: (engine.load_weights(new_weights, engine.version + 1), engine.version)[1] \
        if t == 3 else None
    generations = engine.generate(prompts, 2, sampling)
    assert engine.version == 6
    for g in generations:
        assert g.versions == [[5, 6] if len(ids) > 3 else [5, 5] for ids in g.response_ids]


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_non_finite_logits_stop_the_rollout_with_a_clear_error(tiny_lm, do_sample):
    """The draw skips torch.multinomial's validity check (a read-back per token): NaN logits must still raise, at the
    next stop check, rather than give arbitrary tokens."""
    model, tok = copy.deepcopy(tiny_lm[0]), tiny_lm[1]
    with torch.no_grad():
        model.lm_head.weight[5].fill_(float("nan"))  # every row's logit of token 5: NaN from the first step
    with pytest.raises(FloatingPointError, match="NaN or infinite"):
        sample_responses(model, tok, _ragged_prompts(tok), 12, n=2, do_sample=do_sample)


@pytest.mark.parametrize("every", [1, STOP_CHECK_EVERY], ids=["cpu", "accelerator"])
def test_a_model_with_sliding_window_layers_decodes_as_the_old_loop(qwen3_model_dir, every, monkeypatch):
    """Sliding-window layers keep only the window in transformers' cache, so they cannot be copied into the static
    cache: such a model decodes on transformers' own growing cache, and gives the old loop's responses (a window of 4
    tokens, shorter than the prompts and the responses, on every other layer)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ggpo_lightning.models.loading import load_tokenizer

    monkeypatch.setattr(hf_engine, "_stop_check_every", lambda device: every)
    config = AutoConfig.from_pretrained(qwen3_model_dir)
    config.use_sliding_window, config.sliding_window = True, 4
    config.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                          for i in range(config.num_hidden_layers)]
    torch.manual_seed(0)
    model, tok = AutoModelForCausalLM.from_config(config).eval(), load_tokenizer(qwen3_model_dir)
    prompts = [ids + ids for ids in _ragged_prompts(tok)]  # 2 to 12 tokens
    results = []
    for sample in (reference_sample_responses, sample_responses):
        torch.manual_seed(3)
        results.append(sample(model, tok, prompts, 16, n=2, record_logprobs=True, do_sample=True, temperature=1.0))
    (old, old_logprobs), new = results
    assert new.responses == old
    assert max(len(r) for r in old) > 4  # decoded past the window
    for got, want in zip(new.logprobs, old_logprobs):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=LOGPROB_ATOL)
    cache = model(input_ids=torch.tensor([prompts[1]]), use_cache=True).past_key_values
    assert any(type(layer).__name__ == "DynamicSlidingWindowLayer" for layer in cache.layers)  # the case it covers
