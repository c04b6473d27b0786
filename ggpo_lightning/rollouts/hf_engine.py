"""The embedded rollout engine: transformers ``generate`` on a private copy of the learner (KV cache, batched,
left padding)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ggpo_lightning.core.logprobs import pack_sequences, token_logprobs
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.engine import Generation, Weights, copy_pairs

__all__ = ["HFGenerateEngine", "generate_responses"]


class HFGenerateEngine:
    """Samples with ``model.generate`` on a private copy of the learner (with LoRA: of the plain base
    model, loaded with the merged weights at each sync).

    ``dtype`` lets the behavior model run in another precision than the learner
    (e.g. bf16 sampling for an fp32 learner: the training-inference mismatch setting).

    ``share=True`` samples with ``learner`` itself instead of a copy (one model less in
    memory). That is exact only when the engine would hold the learner's current weights
    at every rollout: a sync after every update, the learner's precision, and a plain
    model; ``load_weights`` then only records the version. The model is put in eval mode
    for sampling and back in its previous mode after.
    """

    def __init__(self, learner: nn.Module, tokenizer, dtype: torch.dtype | None = None,
                 record_logprobs: bool = False, share: bool = False) -> None:
        if share and dtype is not None:
            raise ValueError("a shared engine samples with the learner itself: it cannot have its own dtype")
        self.shared = share
        self.model = learner if share else copy.deepcopy(learner).eval().requires_grad_(False)
        if dtype is not None:
            self.model.to(dtype)
        self.tokenizer = tokenizer
        self.record_logprobs = record_logprobs
        self.version = 0
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens for batched generation")

    def unshare(self) -> None:
        """Sample with a private copy of the model from now on (a no-op when already private)."""
        if self.shared:
            self.model = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.shared = False

    def load_weights(self, learner: Weights, version: int) -> None:
        if self.shared:
            if learner is not self.model:
                raise ValueError("a shared engine samples with its learner; it cannot load other weights")
            self.version = version
            return
        state = learner.state_dict() if isinstance(learner, nn.Module) else learner
        with torch.no_grad():
            # copies (and casts to the engine's dtype) in place: no reallocation
            if isinstance(state, Mapping):
                self.model.load_state_dict(state)
            else:
                copy_pairs(self.model.state_dict(), state)
        self.version = version

    def to(self, device: torch.device | str) -> HFGenerateEngine:
        self.model.to(device)
        return self

    def state_dict(self, step: int) -> dict[str, Tensor] | None:
        """The engine's weights, or None where a resume rebuilds them from the learner's.

        An engine synced at this very step holds the learner's weights (cast or merged as a
        sync does), and a shared engine is the learner: saving them again would add a full
        model copy to every checkpoint (on rank 0, in one file). A stale engine's weights
        are saved (the same on every rank).
        """
        if self.shared or self.version == step:
            return None
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Tensor] | None, version: int) -> bool:
        self.version = version
        if state is None:
            return True
        if not self.shared:
            self.model.load_state_dict(state)
        return False

    def close(self) -> None:
        """Nothing to release: the model is ordinary memory."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        per_call = max(1, sampling.generation_batch_size // n)  # whole groups per call
        responses: list[list[int]] = []  # prompt i's responses at rows i*n .. i*n+n-1
        logprobs: list[list[float]] = []
        was_training = self.model.training
        self.model.eval()  # a shared learner is in train mode (dropout) between rollouts
        try:
            for start in range(0, len(prompt_ids), per_call):
                prompts = prompt_ids[start:start + per_call]
                chunk = self._sample(prompts, n, sampling)
                responses.extend(chunk)
                if self.record_logprobs:
                    logprobs.extend(self._score([p for p in prompts for _ in range(n)], chunk))
        finally:
            self.model.train(was_training)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [
            Generation(
                prompt_ids=list(prompt),
                response_ids=responses[i * n:(i + 1) * n],
                responses=texts[i * n:(i + 1) * n],
                token_logprobs=logprobs[i * n:(i + 1) * n] if self.record_logprobs else None,
            )
            for i, prompt in enumerate(prompt_ids)
        ]

    def _score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Token log-probs of the sampled responses under the engine's model (one extra forward).

        A separate forward, not ``generate``'s ``output_logits``: those keep ``[B, T, V]``
        logits alive, gigabytes for real vocabularies.
        """
        input_ids, attention, target = pack_sequences(prompts, responses, self.tokenizer.pad_token_id,
                                                      next(self.model.parameters()).device)
        tokens = token_logprobs(self.model, input_ids, attention, target)  # [B, L]
        return [tokens[i][target[i]].tolist() for i in range(len(prompts))]

    def _sample(self, prompts: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[int]]:
        return generate_responses(self.model, self.tokenizer, prompts, sampling.max_new_tokens, n=n, do_sample=True,
                                  temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)


@torch.no_grad()
def generate_responses(model: nn.Module, tokenizer, prompts: list[list[int]], max_new_tokens: int, n: int = 1,
                       **decoding) -> list[list[int]]:
    """``n`` responses per prompt from one ``model.generate`` call on left-padded prompts; prompt ``i``'s
    responses at ``i*n .. i*n+n-1``, each cut after its first EOS.

    With ``n > 1`` the prompts' key-value cache (all but their last token) is computed once
    per prompt and repeated ``n`` times, instead of once per response: the same attention
    inputs, a fraction of the prompt work. ``decoding`` goes to ``generate``
    (``do_sample``, ``temperature``, ``top_p``, ...).
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # [G, P]
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    prefix: dict = {}
    if n > 1 and width > 1 and getattr(model.config, "use_cache", True):
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded prompts
        out = model(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1],
                    use_cache=True)
        name = "cache" if "cache" in out else "past_key_values"  # transformers >= 5.x renamed it "cache"
        out[name].batch_repeat_interleave(n)  # [G * n, ...]: generate continues from the last prompt token
        prefix = {name: out[name]}
    input_ids, attention = input_ids.repeat_interleave(n, 0), attention.repeat_interleave(n, 0)  # [G * n, P]
    result = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                            pad_token_id=pad, eos_token_id=eos, **prefix, **decoding)
    responses = []
    for seq in result[:, width:].tolist():  # [B, T]
        responses.append(seq[: seq.index(eos) + 1] if eos in seq else seq)
    return responses
