"""Prompts in, scored groups out: one rollout of K responses per prompt, with the verifier's rewards and the
counts of what it cost."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from ggpo_verifiers import VerifierStats

from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.engine import RolloutEngine, cached_weight_casts

__all__ = ["GroupRollout", "RolloutCounts", "encode_prompt"]


class GroupRollout:
    """Prompts in, scored groups out: the engine's K responses per prompt and the verifier's rewards, each response
    flagged ``truncated`` when it reached ``max_new_tokens`` without EOS (its reward then 0 with
    ``model.rollout.truncation: zero``).

    Counts what it did: ``seconds``, ``tokens`` and ``verify_seconds`` (of ``seconds``, the
    wait for the verifier) since the last :meth:`take_counts` (one step's rollout) and
    ``generated_samples`` over the run.
    ``verifier`` is set once its worker pool is started (the module's ``setup``).
    """

    def __init__(self, engine: RolloutEngine, tokenizer, config: RolloutConfig, chat_template: bool = False) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.verifier = None
        self.seconds = 0.0
        self.tokens = 0
        self.verify_seconds = 0.0
        self.generated_samples = 0

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text, self.chat_template)

    def truncated(self, response_ids: list[int]) -> bool:
        """The response reached ``sampling.max_new_tokens`` without EOS (cut, not finished)."""
        return len(response_ids) >= self.config.sampling.max_new_tokens and (
            not response_ids or response_ids[-1] != self.tokenizer.eos_token_id)

    @torch.no_grad()
    def __call__(self, rows: Sequence[PromptRow]) -> list[RolloutGroup]:
        start = time.perf_counter()
        k = self.config.k
        with cached_weight_casts(self.engine):
            generations = self.engine.generate([self.encode(r.prompt) for r in rows], k, self.config.sampling)
        responses = [text for g in generations for text in g.responses]
        verify_start = time.perf_counter()
        rewards = self.verifier.score_batch(responses, [r.gold for r in rows for _ in range(k)])
        self.verify_seconds += time.perf_counter() - verify_start
        groups = []
        for i, (row, g) in enumerate(zip(rows, generations)):
            truncated = [self.truncated(ids) for ids in g.response_ids]
            scored = [0.0 if cut and self.config.truncation == "zero" else float(x)
                      for x, cut in zip(rewards[i * k:(i + 1) * k], truncated)]
            groups.append(RolloutGroup(
                prompt_id=row.id, prompt=row.prompt, gold=row.gold, prompt_ids=g.prompt_ids,
                response_ids=g.response_ids, responses=g.responses, rewards=scored,
                behavior_version=self.engine.version, behavior_logprobs=g.token_logprobs, truncated=truncated))
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(ids) for g in generations for ids in g.response_ids)
        self.generated_samples += len(responses)
        return groups

    def take_counts(self) -> RolloutCounts:
        """What was counted since the last call (then reset), the verifier's outcome counts included."""
        counts = RolloutCounts(self.seconds, self.tokens, self.verify_seconds, self.verifier.reset_stats())
        self.seconds, self.tokens, self.verify_seconds = 0.0, 0, 0.0
        return counts


@dataclass
class RolloutCounts:
    """One step's rollout (or, in async mode, one produced batch's), as counted by :class:`GroupRollout`."""

    seconds: float = 0.0
    """Wall-clock seconds of generation and scoring."""
    tokens: int = 0
    """Response tokens generated."""
    verify_seconds: float = 0.0
    """Of ``seconds``, the wait for the verifier."""
    verifier: VerifierStats = field(default_factory=VerifierStats)
    """The verifier's outcome counts (correct, wrong, timeout, crashed, ...)."""


def encode_prompt(tokenizer, text: str, chat_template: bool = False) -> list[int]:
    """Token ids of a prompt: the text as it is (base models), or as a user turn of the
    tokenizer's chat template with the generation prompt appended (instruction-tuned models)."""
    if chat_template:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    return tokenizer(text)["input_ids"]


