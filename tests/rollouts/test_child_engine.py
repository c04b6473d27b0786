"""The HF engine sampling in a child process on shared weights (async mode's default worker)."""

from __future__ import annotations

import copy

import torch

from ggpo_lightning.core.logprobs import response_token_logprobs
from ggpo_lightning.rollouts.hf.child_process import ChildProcessEngine
from ggpo_lightning.rollouts.config import SamplingConfig


def test_the_child_samples_with_the_weights_loaded_in_the_parent(tiny_lm):
    model, tok = tiny_lm
    engine = ChildProcessEngine(model, tok, record_logprobs=True)
    sampling = SamplingConfig(max_new_tokens=4)
    prompts = [tok("1+2=")["input_ids"], tok("3+4=")["input_ids"]]
    try:
        first = engine.generate(prompts, 3, sampling)
        child = engine._child.process
        assert child.is_alive() and child.pid != torch.multiprocessing.current_process().pid
        updated = copy.deepcopy(model)
        with torch.no_grad():
            for p in updated.parameters():
                p.add_(0.05 * torch.randn_like(p))
        engine.load_weights(updated, version=7)  # an in-place copy in the parent, into the shared storages
        generations = engine.generate(prompts, 3, sampling)
        assert engine._child.process is child  # the same process: it saw the new weights through shared memory
        for generation in generations:
            # the child's recorded log-probs are those of the new weights (scored here by a forward of `updated`)
            expected = response_token_logprobs(updated, [generation.prompt_ids] * 3, generation.response_ids,
                                               tok.pad_token_id)
            for got, want in zip(generation.token_logprobs, expected):
                assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-5)
        old = response_token_logprobs(updated, [first[0].prompt_ids] * 3, first[0].response_ids, tok.pad_token_id)
        assert not all(torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
                       for a, b in zip(first[0].token_logprobs, old))  # the first rollout's were not (old weights)
    finally:
        engine.close()
    assert not child.is_alive() and engine._child.process is None
