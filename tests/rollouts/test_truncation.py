"""Truncated responses (max_new_tokens reached without EOS): flagged, and scored or masked as the recipe says."""

from __future__ import annotations

import pytest
import torch
from ggpo_verifiers import get_verifier

from ggpo_lightning.core.batch import objective_inputs, pack_step
from ggpo_lightning.core.drift import behavior_anchor
from ggpo_lightning.core.objectives import ggpo_loss
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.rollouts.protocol import Generation
from ggpo_lightning.rollouts.group import GroupRollout


class CuttingEngine:
    """Two responses per prompt, both answering 3: one ends with EOS, one is cut at max_new_tokens."""

    version = 0

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, n, sampling):
        three = self.tokenizer("3", add_special_tokens=False)["input_ids"]
        cut = (three * sampling.max_new_tokens)[:sampling.max_new_tokens]  # no EOS
        return [Generation(list(p), [three + [self.tokenizer.eos_token_id], cut], ["3", "3"], None)
                for p in prompt_ids]


@pytest.mark.parametrize("mode,rewards", [("verified", [1.0, 1.0]), ("zero", [1.0, 0.0]), ("mask", [1.0, 1.0])])
def test_each_truncation_mode(tiny_lm, mode, rewards):
    _, tokenizer = tiny_lm
    config = RolloutConfig(k=2, truncation=mode, sampling=SamplingConfig(max_new_tokens=3))
    rollout = GroupRollout(CuttingEngine(tokenizer), tokenizer, config)
    rollout.verifier = get_verifier("numeric", workers=1)
    try:
        [group] = rollout([PromptRow("p", "1+2=", "3")])
    finally:
        rollout.verifier.close()
    assert group.truncated == [False, True] and group.rewards == rewards
    batch = pack_step([group], tokenizer.pad_token_id, torch.device("cpu"), mask_truncated=mode == "mask")
    assert batch.truncated.tolist() == [[False, True]] and batch.present_mask.tolist() == [[True, True]]
    assert batch.group_mask.tolist() == [[True, mode != "mask"]]  # the objective's responses
    token = batch.target_mask.float() * -0.5  # [B, L]
    inputs = objective_inputs(batch, token, token, "sequence")
    assert inputs.logp.tolist() == [[-1.0, -1.5]]  # both responses' log-probs, whatever the mask
    loss = ggpo_loss(inputs.logp, inputs.ref_logp, inputs.rewards, 0.04, inputs.mask)
    if mode == "mask":  # one valid response left: no contrast, no GGPO signal
        assert loss.item() == 0.0
    anchor = behavior_anchor(inputs.logp, batch.present_mask)
    assert anchor.item() == pytest.approx(1.25)  # the anchor keeps both of the behavior's samples


def test_an_unknown_mode_names_the_key():
    assert "model.rollout.truncation must be one of ['verified', 'zero', 'mask']" in \
        RolloutConfig(truncation="drop").errors()[0]
