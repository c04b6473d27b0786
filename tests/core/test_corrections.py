"""GRPO's corrections for stale rollouts (docs/METHOD.md#corrections-for-stale-rollouts) against values and
gradients worked out by hand in the comments: truncated IS at token and sequence level, masked IS (IcePop and TRL's
sequence mask), DeepSeek-V3.2's off-policy sequence masking, and the errors that name the recipe key."""

from __future__ import annotations

import math

import pytest
import torch

from ggpo_lightning.core.corrections import importance_weights, off_policy_sequence_mask
from ggpo_lightning.core.objectives import ObjectiveConfig, ObjectiveInputs, get_objective, grpo_loss

f64 = torch.float64
ALL = torch.ones(1, 2, 2, dtype=torch.bool)  # G=1 group, K=2 responses, T=2 tokens each, all valid
REWARDS = torch.tensor([[1.0, 0.0]], dtype=f64)  # scale_by_std=False: A = r - mean r = [+0.5, -0.5]


def stale_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """Learner (= pi_old at the update) and behavior token log-probs whose ratios pi_old / mu are, token by token,

        response 0 (A = +0.5):  0.8 / 0.4 = 2.0,   0.2 / 0.5 = 0.4      (sequence ratio 0.8)
        response 1 (A = -0.5):  0.6 / 0.1 = 6.0,   0.3 / 0.3 = 1.0      (sequence ratio 6.0)
    """
    learner = torch.log(torch.tensor([[[0.8, 0.2], [0.6, 0.3]]], dtype=f64))  # [1, 2, 2]
    behavior = torch.log(torch.tensor([[[0.4, 0.5], [0.1, 0.3]]], dtype=f64))  # [1, 2, 2]
    return learner, behavior


def corrected(mode: str | None = None, clip_max: float = 3.0, clip_min: float | None = None,
              delta: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss on :func:`stale_pair` (no KL term) and its gradient with respect to the learner's log-probs."""
    learner, behavior = stale_pair()
    lp = learner.clone().requires_grad_(True)
    loss = grpo_loss(lp, behavior, ALL, REWARDS, scale_by_std=False, importance_sampling=mode,
                     importance_sampling_clip_max=clip_max, importance_sampling_clip_min=clip_min,
                     off_policy_mask_threshold=delta)
    loss.backward()
    return loss.detach(), lp.grad


@pytest.mark.parametrize("mode, clip_max, clip_min, expected", [
    # token TIS, C = 3: w = min(rho, 3) = [2, 0.4], [3, 1]; the ratio against pi_old is 1 (the clip never acts), so
    # loss_t = -w_t * A_i: -1.0, -0.2, +1.5, +0.5 -> sum 0.8 over 4 tokens = 0.2
    ("token_truncate", 3.0, None, 0.2),
    # token TIS with a floor 0.5: the 0.4 is raised to 0.5: -1.0, -0.25, +1.5, +0.5 -> 0.75 / 4 = 0.1875
    ("token_truncate", 3.0, 0.5, 0.1875),
    # sequence TIS, C = 3: w = min(0.8, 3) = 0.8 on response 0, min(6, 3) = 3 on response 1:
    # -0.5 * 0.8 * 2 tokens + 0.5 * 3 * 2 tokens = -0.8 + 3.0 = 2.2 -> 2.2 / 4 = 0.55
    ("sequence_truncate", 3.0, None, 0.55),
    # IcePop, token mask [0.5, 5]: 2.0 kept (w = 2), 0.4 dropped, 6.0 dropped, 1.0 kept (w = 1):
    # -1.0 + 0 + 0 + 0.5 = -0.5 -> -0.5 / 4 = -0.125 (dropped tokens stay in the denominator)
    ("token_mask", 5.0, 0.5, -0.125),
    # TRL's default, sequence mask with C = 3 and no floor: 0.8 kept (w = 0.8), 6.0 dropped: -0.8 / 4 = -0.2
    ("sequence_mask", 3.0, None, -0.2),
    # a floor of 0.9 drops response 0 as well: nothing left, loss 0
    ("sequence_mask", 3.0, 0.9, 0.0),
])
def test_importance_sampling_loss_by_hand(mode, clip_max, clip_min, expected):
    loss, _ = corrected(mode, clip_max, clip_min)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_token_tis_gradient_by_hand():
    # d loss / d log pi_t = -w_t * A_i / 4 (the ratio exp(lp - lp.detach()) has derivative 1, the weight none):
    # response 0: -2 * 0.5 / 4 = -0.25, -0.4 * 0.5 / 4 = -0.05; response 1: 3 * 0.5 / 4 = 0.375, 1 * 0.5 / 4 = 0.125
    _, grad = corrected("token_truncate", 3.0)
    torch.testing.assert_close(grad, torch.tensor([[[-0.25, -0.05], [0.375, 0.125]]], dtype=f64))


def test_icepop_gradient_by_hand():
    # the masked tokens (0.4 and 6.0) get none; the kept ones -w_t * A_i / 4: -2 * 0.5 / 4 = -0.25, +1 * 0.5 / 4 = 0.125
    _, grad = corrected("token_mask", 5.0, 0.5)
    torch.testing.assert_close(grad, torch.tensor([[[-0.25, 0.0], [0.0, 0.125]]], dtype=f64))


def test_the_weights_alone_by_hand():
    learner, behavior = stale_pair()
    w = importance_weights(learner, behavior, ALL, "sequence_truncate", clip_max=3.0)
    torch.testing.assert_close(w, torch.tensor([[[0.8, 0.8], [3.0, 3.0]]], dtype=f64))  # broadcast per response
    w = importance_weights(learner, behavior, ALL, "token_mask", clip_max=5.0, clip_min=0.5)
    torch.testing.assert_close(w, torch.tensor([[[2.0, 0.0], [0.0, 1.0]]], dtype=f64))
    assert not w.requires_grad


def opsm_case(delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Off-policy sequence masking without IS: GRPO as today (ratio against mu) plus the mask.

    response 0 (A = +0.5): pi = mu = [0.5, 0.5]           ratios [1, 1]
    response 1 (A = -0.5): pi = [0.1, 0.5], mu = [0.4, 0.5]  ratios [0.25, 1]
    mean per-token KL(mu || pi_old) of response 1: (log 0.4 - log 0.1 + 0) / 2 = log(4) / 2 = 0.693
    """
    lp = torch.log(torch.tensor([[[0.5, 0.5], [0.1, 0.5]]], dtype=f64)).requires_grad_(True)
    behavior = torch.log(torch.tensor([[[0.5, 0.5], [0.4, 0.5]]], dtype=f64))
    loss = grpo_loss(lp, behavior, ALL, REWARDS, scale_by_std=False, off_policy_mask_threshold=delta)
    loss.backward()
    return loss.detach(), lp.grad


def test_off_policy_sequence_mask_by_hand():
    # delta = 1.0 > 0.693: response 1 kept. Its first token: min(0.25 * -0.5, clip(0.25, 0.8, 1.2) * -0.5) =
    # min(-0.125, -0.4) = -0.4 (clipped: no gradient); second: -0.5. Response 0: +0.5, +0.5.
    # loss = -(0.5 + 0.5 - 0.4 - 0.5) / 4 = -0.025; gradient -r_t * A_i / 4 where unclipped: -0.125, -0.125, 0, +0.125
    loss, grad = opsm_case(1.0)
    assert loss.item() == pytest.approx(-0.025, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[[-0.125, -0.125], [0.0, 0.125]]], dtype=f64))
    # delta = 0.5 < 0.693 and A < 0: response 1 dropped: loss = -(0.5 + 0.5) / 4 = -0.25, no gradient on it
    loss, grad = opsm_case(0.5)
    assert loss.item() == pytest.approx(-0.25, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[[-0.125, -0.125], [0.0, 0.0]]], dtype=f64))


def test_the_sequence_mask_keeps_positive_advantages_whatever_their_kl():
    lp = torch.log(torch.tensor([[[0.01, 0.01], [0.01, 0.01]]], dtype=f64))  # [1, 2, 2]
    mu = torch.zeros(1, 2, 2, dtype=f64)  # log mu - log pi = log 100 = 4.6 per token on both responses
    keep = off_policy_sequence_mask(lp, mu, ALL, torch.tensor([[0.5, -0.5]], dtype=f64), threshold=0.5)
    assert keep.tolist() == [[True, False]]
    keep = off_policy_sequence_mask(lp, mu, ALL, torch.tensor([[0.5, -0.5]], dtype=f64), threshold=5.0)
    assert keep.tolist() == [[True, True]]


@pytest.mark.parametrize("mode", ["sequence_truncate", "sequence_mask", "token_truncate", "token_mask"])
def test_ratios_beyond_float_range_and_garbage_off_the_mask_stay_finite(mode):
    # a sequence log-ratio of 3000 nats (exp overflows), and NaN behavior log-probs on an absent token
    lp = torch.full((1, 2, 3), -1.0, dtype=f64).requires_grad_(True)
    behavior = torch.tensor([[[-1001.0, -1001.0, float("nan")], [-1001.0, -1001.0, -1001.0]]], dtype=f64)
    mask = torch.tensor([[[True, True, False], [True, True, True]]])
    loss = grpo_loss(lp, behavior, mask, REWARDS, importance_sampling=mode, importance_sampling_clip_min=0.5,
                     off_policy_mask_threshold=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all() and lp.grad[0, 0, 2] == 0


def test_the_registry_passes_the_recipe_keys_through():
    learner, behavior = stale_pair()
    inputs = ObjectiveInputs(logp=learner.sum(-1), rewards=REWARDS, mask=torch.ones(1, 2, dtype=torch.bool),
                             ref_logp=learner.sum(-1), token_logp=learner, token_mask=ALL, ref_token_logp=learner,
                             behavior_token_logp=behavior)
    config = ObjectiveConfig("grpo", beta=0.04, importance_sampling="token_mask", importance_sampling_clip_max=5.0,
                             importance_sampling_clip_min=0.5, off_policy_mask_threshold=0.5)
    expected = grpo_loss(learner, behavior, ALL, REWARDS, kl_coef=0.04, ref_token_logp=learner,
                         importance_sampling="token_mask", importance_sampling_clip_max=5.0,
                         importance_sampling_clip_min=0.5, off_policy_mask_threshold=0.5)
    assert get_objective("grpo").loss(inputs, config) == expected
    assert config.errors() == []


@pytest.mark.parametrize("settings, key", [
    (dict(importance_sampling="token_clip"), "model.objective.importance_sampling must be one of"),
    (dict(importance_sampling="token_truncate", importance_sampling_clip_max=0.0),
     "model.objective.importance_sampling_clip_max must be a finite number > 0"),
    (dict(importance_sampling="token_truncate", importance_sampling_clip_max=-2.0),
     "model.objective.importance_sampling_clip_max must be a finite number > 0"),
    (dict(importance_sampling="token_mask", importance_sampling_clip_min=5.0, importance_sampling_clip_max=5.0),
     "model.objective.importance_sampling_clip_min must be >= 0 and below"),
    (dict(importance_sampling="token_mask", importance_sampling_clip_min=-0.5),
     "model.objective.importance_sampling_clip_min must be >= 0 and below"),
    (dict(importance_sampling_clip_min=0.5), "model.objective.importance_sampling_clip_min is set but"),
    (dict(off_policy_mask_threshold=-0.1), "model.objective.off_policy_mask_threshold must be a finite number >= 0"),
])
def test_invalid_settings_give_one_line_naming_the_recipe_key(settings, key):
    errors = ObjectiveConfig("grpo", **settings).errors()
    assert len(errors) == 1 and errors[0].startswith(key) and "\n" not in errors[0]
    with pytest.raises(ValueError, match=key.removeprefix("model.objective.")):  # the loss refuses them as well
        grpo_loss(*stale_pair(), ALL, REWARDS, **{k: v for k, v in settings.items()})


@pytest.mark.parametrize("name", ["ggpo", "agro", "maxrl"])
@pytest.mark.parametrize("settings", [dict(importance_sampling="token_truncate"), dict(off_policy_mask_threshold=0.5),
                                      dict(importance_sampling="token_mask", importance_sampling_clip_min=0.5)])
def test_a_correction_on_an_objective_that_does_not_take_it_is_an_error(name, settings):
    errors = ObjectiveConfig(name, **settings).errors()
    assert len(errors) == len(settings)
    for key, line in zip(settings, errors):
        assert line == (f"model.objective.{key} is set but objective {name!r} does not take it (taken by: grpo); "
                        "remove it or change model.objective.name")


def test_on_policy_the_corrections_change_nothing():
    # mu = pi_old: every weight is 1 and every KL 0, so each correction is GRPO as today
    lp = torch.log(torch.tensor([[[0.5, 0.25], [0.5, 0.5]]], dtype=f64))
    plain = grpo_loss(lp, lp, ALL, REWARDS)
    for mode in ("token_truncate", "sequence_truncate", "token_mask", "sequence_mask"):
        assert grpo_loss(lp, lp, ALL, REWARDS, importance_sampling=mode, importance_sampling_clip_min=0.5,
                         off_policy_mask_threshold=0.0).item() == pytest.approx(plain.item(), abs=1e-15)
    assert math.isfinite(plain.item())
