"""The typed step batch on its own: packing, the [G, K] layout, objective inputs, the reference cache; and the
step's metrics against hand values."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from ggpo_lightning.core.batch import ReferenceLogprobCache, batch_token_logprobs, objective_inputs, pack_step
from ggpo_lightning.core.logprobs import attention_pair_cost, layout_cost, packed_shape
from ggpo_lightning.core.metrics import step_metrics
from ggpo_lightning.models.loading import load_causal_lm
from ggpo_lightning.testing import make_group

PAD = 0


def groups():
    # group a: K=3, group b: K=2 (one response missing); behavior log-probs one per response token
    a = make_group([5, 6], [[7], [8, 9], [7, 9]], [1.0, 0.0, 1.0], version=4, prompt_id="a",
                   behavior_logprobs=[[-0.5], [-1.0, -2.0], [-0.5, -0.25]])
    b = make_group([6], [[9, 8, 7], [8]], [0.0, 0.0], version=2, prompt_id="b",
                   behavior_logprobs=[[-1.0, -1.0, -1.0], [-3.0]])
    return [a, b]


def test_pack_step_lays_out_rows_masks_and_rewards():
    a, b = groups()
    batch = pack_step([a, b], PAD, torch.device("cpu"))
    assert batch.input_ids.shape[0] == 5  # B: responses, group after group
    assert batch.group_mask.tolist() == [[True, True, True], [True, True, False]]  # [G, K]
    assert batch.rewards.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert batch.versions.tolist() == [4, 2]
    assert batch.target_mask.sum(-1).tolist() == [1, 2, 2, 3, 1]  # response tokens per row
    # behavior log-probs on the response tokens only, in token order
    assert batch.behavior_token_logp.sum(-1).tolist() == pytest.approx([-0.5, -3.0, -0.75, -3.0, -3.0])
    assert batch.to_groups(torch.arange(5.0)).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 0.0]]
    assert batch.tokens == int(batch.attention_mask.sum())


def test_pack_step_refuses_missing_or_misaligned_behavior_logprobs():
    a, b = groups()
    b.behavior_logprobs = None
    assert pack_step([a, b], PAD, torch.device("cpu")).behavior_token_logp is None
    with pytest.raises(ValueError, match="needs behavior log-probs"):
        pack_step([a, b], PAD, torch.device("cpu"), require_behavior_logp=True)
    a, b = groups()
    b.behavior_logprobs = [[-1.0], [-3.0]]
    with pytest.raises(ValueError, match="group 'b': behavior_logprobs do not match"):
        pack_step([a, b], PAD, torch.device("cpu"))


def test_attention_pair_cost_and_layout_cost_against_hand_values():
    from transformers import LlamaConfig

    # the reasoning recipe's model: layer weights 2*128*128 (q, o) + 2*128*128 (k, v) + 3*128*512 (gated MLP)
    # = 262144; a pair costs 4 * 4 heads * 32 = 512 FLOPs against a position's 2 * 262144
    config = LlamaConfig(hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=4)
    assert attention_pair_cost(config) == pytest.approx(1 / 1024)
    gqa = LlamaConfig(hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=1)
    assert attention_pair_cost(gqa) == pytest.approx(512 / (2 * (2 * 128 * 128 + 2 * 128 * 32 + 3 * 128 * 512)))
    assert attention_pair_cost(object()) is None  # no sizes: no estimate
    assert layout_cost(3, 100, 0.01) == pytest.approx(3 * 100 * (1 + 1.0))


def _groups_of(prompt_len: int, response_len: int, k: int = 8):  # 4 groups of K equal-length responses
    return [make_group(list(range(1, prompt_len + 1)), [[7 + i % 3] * response_len for i in range(k)], [0.0] * k,
                       prompt_id=str(g)) for g in range(4)]


def test_pack_step_keeps_the_shared_prefix_rows_only_where_they_cost_less():
    pair = 1 / 1024  # the reasoning recipe's model
    # 3-token answers after 40-token prompts (the quickstart's shape): one row per group saves most positions
    short = _groups_of(40, 3)
    assert pack_step(short, PAD, torch.device("cpu"), shared_prefix=True, pair_cost=pair).packed is not None
    # 70-token solutions after 49-token prompts (the reasoning recipe's): rows of up to 512 tokens with dense
    # attention cost more than the 6 prompt copies they save per group (measured there: 1.67 s a step, 1.79 packed)
    long = _groups_of(49, 70)
    batch = pack_step(long, PAD, torch.device("cpu"), shared_prefix=True, pair_cost=pair)
    packed = pack_step(long, PAD, torch.device("cpu"), shared_prefix=True).packed  # no estimate: always packed
    assert batch.packed is None and packed is not None
    assert packed_shape([g.prompt_ids for g in long], [g.response_ids for g in long]) == tuple(packed.input_ids.shape)
    assert layout_cost(*packed.input_ids.shape, pair) > layout_cost(*batch.input_ids.shape, pair)
    assert packed.input_ids.numel() < batch.input_ids.numel()  # fewer positions, yet dearer
    assert pack_step(short, PAD, torch.device("cpu"), shared_prefix=False, pair_cost=pair).packed is None


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_objective_inputs_sum_tokens_per_response(level):
    batch = pack_step(groups(), PAD, torch.device("cpu"))
    token = batch.target_mask.float() * -1.0  # [B, L]: -1 per response token
    ref = batch.target_mask.float() * -2.0
    inputs = objective_inputs(batch, token, ref, level)
    assert inputs.logp.tolist() == [[-1.0, -2.0, -2.0], [-3.0, -1.0, 0.0]]  # [G, K], 0 where absent
    assert inputs.ref_logp.tolist() == [[-2.0, -4.0, -4.0], [-6.0, -2.0, 0.0]]
    torch.testing.assert_close(inputs.behavior_logp, torch.tensor([[-0.5, -3.0, -0.75], [-3.0, -3.0, 0.0]]))
    if level == "sequence":
        assert inputs.token_logp is None and inputs.behavior_token_logp is None
    else:
        assert inputs.token_logp.shape == (2, 3, batch.input_ids.shape[1])  # [G, K, L]
        assert inputs.token_mask[1, 2].sum() == 0 and inputs.behavior_token_logp[0, 1].sum() == pytest.approx(-3.0)


def test_the_reference_cache_computes_each_group_once_until_cleared(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32).eval()
    a, b = groups()
    cache = ReferenceLogprobCache()
    first = cache.token_logprobs(model, pack_step([a], PAD, torch.device("cpu")), PAD, 64)
    assert len(cache) == 1
    both = pack_step([b, a], PAD, torch.device("cpu"))
    with torch.no_grad():
        direct = batch_token_logprobs(model, both, 64)  # [B, L]
    got = cache.token_logprobs(model, both, PAD, 64)
    torch.testing.assert_close(got, direct, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2:, :first.shape[1]], first, rtol=1e-5, atol=1e-6)  # a's, reused
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    stale = cache.token_logprobs(model, both, PAD, 64)
    torch.testing.assert_close(stale, got)  # cached: the cache trusts the reference to be frozen
    cache.clear()
    assert not torch.allclose(cache.token_logprobs(model, both, PAD, 64), got)  # recomputed after a refresh
    del a, b, both
    gc.collect()
    assert len(cache) == 0  # entries leave with their groups


def test_step_metrics_against_hand_values():
    batch = pack_step(groups(), PAD, torch.device("cpu"))
    token = batch.target_mask.float() * -1.0
    inputs = objective_inputs(batch, token, batch.target_mask.float() * -1.0, "sequence")
    metrics = step_metrics(inputs, torch.tensor(0.25), batch, step=5, beta=0.04)
    assert metrics["loss"].item() == 0.25
    assert metrics["reward"].item() == pytest.approx(2 / 5)  # two correct of five present responses
    assert metrics["accuracy"].item() == pytest.approx(2 / 5)
    assert metrics["staleness"].item() == pytest.approx(2.0)  # (5 - 4 + 5 - 2) / 2
    assert metrics["staleness_max"].item() == 3.0
    # the anchor: mean over groups of mean over responses of -log pi: ((1 + 2 + 2)/3 + (3 + 1)/2) / 2
    assert metrics["behavior_anchor"].item() == pytest.approx((5 / 3 + 2) / 2)
    # drift from the recorded behavior: d = log pi - log mu = [[-0.5, 1, -1.25], [0, 2]]; k1 = mean_g mean_i (-d)
    assert metrics["kl_behavior_k1"].item() == pytest.approx(((0.5 - 1 + 1.25) / 3 + (0 - 2) / 2) / 2)
    assert math.isnan(metrics["logratio_correct"].item()) is False
