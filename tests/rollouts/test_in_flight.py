"""In-flight updates emulated on the HF engine (issue 43): a sync's weights land at a random decoding step of the
next rollout; responses carry [first, last] versions, each token's behavior log-prob is the one of the weights that
sampled it; a checkpoint holds what the next swap needs."""

from __future__ import annotations

import copy

import pytest
import torch
from weight_swap import final_norm_changed

from ggpo_lightning.core.logprobs import response_token_logprobs
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.rollouts.factory import make_engine
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine
from ggpo_lightning.rollouts.hf.in_flight import InFlightUpdates

PROMPTS_TEXT = ("1+2=", "+", "9", "+++", "14+4=", "7+7=")  # "+": long answers
SAMPLING = SamplingConfig(max_new_tokens=12, temperature=1.0)


def _engine(model, tok, seed: int = 0) -> InFlightUpdates:
    return InFlightUpdates(HFGenerateEngine(model, tok, record_logprobs=True), seed=seed)


def _prompts(tok) -> list[list[int]]:
    return [tok(text)["input_ids"] for text in PROMPTS_TEXT]


def test_a_sync_lands_inside_the_next_rollout_with_each_tokens_own_logprob(tiny_lm):
    """Before the first rollout a sync loads at once; after it, the weights wait for the next rollout and are swapped
    in before a step inside it: tokens before it are scored by the old weights, the rest by the new ones (the new
    weights change the final norm only, so the cache the old ones filled is the new ones' own: an exact check)."""
    model, tok = tiny_lm
    old, new = copy.deepcopy(model), final_norm_changed(model, seed=3)
    engine = _engine(model, tok)
    engine.load_weights(old, version=0)  # before any rollout: at once
    assert engine.version == 0 and engine.pending is None
    torch.manual_seed(0)
    engine.generate(_prompts(tok), 4, SAMPLING)  # the first rollout: its mean length places the next swap
    engine.load_weights(new, version=1)
    assert engine.version == 0 and engine.pending is not None  # held, not loaded
    torch.manual_seed(1)
    generations = engine.generate(_prompts(tok), 4, SAMPLING)
    assert engine.version == 1 and engine.pending is None
    metrics = engine.take_metrics()
    swap = int(metrics["in_flight_swap_step"])
    assert 1 <= swap <= SAMPLING.max_new_tokens
    straddling = 0
    for g in generations:
        old_scores = response_token_logprobs(old, [g.prompt_ids] * 4, g.response_ids, tok.pad_token_id)
        new_scores = response_token_logprobs(new, [g.prompt_ids] * 4, g.response_ids, tok.pad_token_id)
        for ids, recorded, versions, by_old, by_new in zip(g.response_ids, g.token_logprobs, g.versions,
                                                           old_scores, new_scores):
            assert versions == ([0, 1] if len(ids) > swap else [0, 0])
            straddling += versions == [0, 1]
            expected = [*by_old[:swap], *by_new[swap:]]
            assert recorded == pytest.approx(expected, abs=1e-5)
    assert straddling > 0  # the drawn step fell inside some responses
    assert metrics["in_flight_straddling"] == pytest.approx(straddling / 24)
    assert engine.take_metrics() == {}  # taken


def test_weights_whose_step_no_response_reaches_land_after_the_rollout(tiny_lm):
    model, tok = tiny_lm
    engine = _engine(model, tok)
    engine.generate(_prompts(tok), 2, SAMPLING)
    engine.load_weights(final_norm_changed(model, seed=4), version=4)
    generations = engine.generate(_prompts(tok), 2, SamplingConfig(max_new_tokens=1))  # one step: t = 0 only
    assert all(v == [0, 0] for g in generations for v in g.versions)
    assert engine.version == 4 and engine.pending is None  # loaded after the rollout, for the next one
    assert engine.take_metrics()["in_flight_straddling"] == 0.0


def test_the_held_weights_are_a_copy_taken_at_the_sync(tiny_lm):
    """The learner trains on between the sync and the swap: what lands is the learner as it was at the sync."""
    model, tok = tiny_lm
    learner = final_norm_changed(model, seed=5)
    engine = _engine(model, tok)
    engine.generate(_prompts(tok), 2, SAMPLING)
    engine.load_weights(learner, version=1)
    at_sync = {name: tensor.clone() for name, tensor in learner.state_dict().items()}
    with torch.no_grad():
        learner.get_decoder().norm.weight.add_(1.0)  # an update after the sync
    engine.generate(_prompts(tok), 2, SAMPLING)
    assert all(torch.equal(engine.model.state_dict()[name], tensor) for name, tensor in at_sync.items())


def test_a_checkpoint_with_weights_in_flight_resumes_to_the_same_rollout(tiny_lm):
    """Saved between a sync and its rollout: the engine's old weights, the held ones and the mean length that places
    the swap. A fresh engine restored from it rolls out what the uninterrupted one does."""
    model, tok = tiny_lm
    engine = _engine(copy.deepcopy(model), tok, seed=7)
    engine.generate(_prompts(tok), 2, SAMPLING)
    engine.load_weights(final_norm_changed(model, seed=6), version=3)
    state = engine.state_dict(step=3)
    assert "in_flight.pending_version" in state and "in_flight.mean_length" in state
    restored = _engine(final_norm_changed(model, seed=99), tok, seed=7)  # other weights until restored
    assert restored.load_state_dict(state, version=0) is False  # the weights were in the checkpoint
    torch.manual_seed(2)
    expected = engine.generate(_prompts(tok), 2, SAMPLING)
    torch.manual_seed(2)
    got = restored.generate(_prompts(tok), 2, SAMPLING)
    assert [g.response_ids for g in got] == [g.response_ids for g in expected]
    assert [g.versions for g in got] == [g.versions for g in expected]
    assert restored.version == engine.version == 3


def test_the_recipe_key_chooses_the_emulation_and_counts_the_extra_update_of_staleness(tiny_lm):
    model, tok = tiny_lm
    keep = RolloutConfig(sync_every=1, in_flight_updates="keep")
    assert keep.errors() == []
    assert keep.staleness_limit == 1  # a sync every update, landing inside the next rollout
    assert not keep.hf_engine_shares_learner(lora=False)  # the learner changes before the swap: a copy is needed
    engine = make_engine(model, tok, keep, "unused", lora=False, record_logprobs=False)
    assert isinstance(engine, InFlightUpdates)
    plain = make_engine(model, tok, RolloutConfig(sync_every=1, in_flight_updates="drain"), "unused", lora=False,
                        record_logprobs=False)
    assert isinstance(plain, HFGenerateEngine)
    errors = RolloutConfig(in_flight_updates="keep", schedule="async").errors()
    assert any("in_flight_updates: keep" in e and "schedule: sync" in e for e in errors)
    assert any("in_flight_updates must be one of" in e for e in RolloutConfig(in_flight_updates="later").errors())
    with pytest.raises(ValueError, match="own copy"):
        InFlightUpdates(HFGenerateEngine(model, tok, share=True), seed=0)
