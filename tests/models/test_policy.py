"""Policy on its own (no Lightning, no engine): learner and reference, the weights an engine loads, the refresh,
and the LoRA branches."""

from __future__ import annotations

import pytest
import torch

from ggpo_lightning.models.checkpoint import LoraState, RolloutState, RunState
from ggpo_lightning.models.loading import load_causal_lm
from ggpo_lightning.models.lora import LoraSettings
from ggpo_lightning.models.policy import Policy
from ggpo_lightning.rollouts.protocol import weight_pairs

pytest.importorskip("peft")

LORA = LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


def logits(model, ids=((1, 2, 3, 4),)):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits


def perturb(model, names=None) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and (names is None or names in name):
                p.add_(0.3 * torch.randn_like(p))


def test_a_full_weight_policy_has_a_frozen_reference_copy_and_refreshes_it(tiny_model_dir):
    policy = Policy(load_causal_lm(str(tiny_model_dir), dtype=torch.float32), lora=None)
    learner, reference = policy.learner, policy.reference
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr()
               for a, b in zip(learner.parameters(), reference.parameters()))  # equal values, own storage
    assert policy.trainable_parameters() == list(learner.parameters())
    assert policy.engine_weights() is learner  # an engine loads the model itself
    perturb(learner)
    with policy.reference_model() as ref:
        assert ref is reference and not torch.allclose(logits(ref), logits(learner))
    policy.refresh_reference([])
    torch.testing.assert_close(logits(reference), logits(learner), rtol=0, atol=0)
    assert policy.lora_state() is None


def test_a_lora_policy_trains_the_adapter_and_its_reference_is_the_base(tiny_model_dir):
    base = load_causal_lm(str(tiny_model_dir), dtype=torch.float32)
    plain_keys = set(base.state_dict())
    before = logits(base)
    policy = Policy(base, LORA)
    assert policy.reference is None
    trainable = policy.trainable_parameters()
    assert trainable and all(".lora_" in n for n, p in policy.learner.named_parameters() if p.requires_grad)
    perturb(policy.learner, ".lora_")
    with policy.reference_model() as reference:
        torch.testing.assert_close(logits(reference), before, rtol=1e-6, atol=1e-6)  # adapter off: the base
    merged = dict(weight_pairs(policy.engine_weights()))
    assert set(merged) == plain_keys  # the plain model's layout, adapter merged in
    engine_copy = load_causal_lm(str(tiny_model_dir), dtype=torch.float32)
    engine_copy.load_state_dict(merged)
    torch.testing.assert_close(logits(engine_copy), logits(policy.learner), rtol=1e-5, atol=1e-5)

    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    sum(p.sum() for p in trainable).backward()
    optimizer.step()
    learned = logits(policy.learner)
    policy.refresh_reference([optimizer])
    assert policy.lora_merges == 1 and not optimizer.state  # the moments described the old adapter
    with policy.reference_model() as reference:
        torch.testing.assert_close(logits(reference), learned, rtol=1e-5, atol=1e-5)  # the new base is the learner
    state = policy.lora_state()
    assert isinstance(state, LoraState) and state.merges == 1 and state.settings["r"] == 4


def test_a_checkpoint_resumes_only_with_its_own_lora_setting_and_base(tiny_model_dir):
    lora = Policy(load_causal_lm(str(tiny_model_dir), dtype=torch.float32), LORA)
    plain = Policy(load_causal_lm(str(tiny_model_dir), dtype=torch.float32), None)
    saved = RunState("old-base", RolloutState(0, None), 0, [], lora=lora.lora_state())
    with pytest.raises(ValueError, match="trained with model.lora but this run is configured without it"):
        plain.check_resumable(saved, "x")
    other = RunState("old-base", RolloutState(0, None), 0, [],
                     lora=LoraState(saved.lora.settings, "another-base", 0))
    with pytest.raises(ValueError, match="--model.model_name_or_path old-base"):
        lora.check_resumable(other, "x")
    lora.check_resumable(saved, "x")  # its own base: accepted
