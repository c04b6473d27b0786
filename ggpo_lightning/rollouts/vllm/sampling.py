"""What the two vLLM engines (in this process, :mod:`~ggpo_lightning.rollouts.vllm.engine`; on servers,
:mod:`~ggpo_lightning.rollouts.fleet.engine`) ask for and read back alike.

- :func:`sampling_params`: one request's vLLM ``SamplingParams`` fields: ``n`` samples, stopped at the tokenizer's EOS,
  token ids only (texts are decoded by the learner's tokenizer, as the HF engine does), and the sampled tokens' own
  log-probs (``logprobs=0``) when recorded.
- :class:`VLLMSampler`: ``generate`` (one request per prompt, each with a seed from torch's global RNG: seeded per run
  and rank, so runs and resumes repeat) and ``greedy`` (temperature 0) over an engine's ``_complete``, which sends the
  requests and reads the replies; :meth:`VLLMSampler._generation` turns a reply's token ids and log-probs into a
  :class:`~ggpo_lightning.rollouts.protocol.Generation`.

Nothing here imports vLLM.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.protocol import Generation, SyncedOnResume

__all__ = ["VLLMSampler", "draw_seeds", "sampling_params"]


def sampling_params(n: int, temperature: float, top_p: float, max_tokens: int, seed: int | None, *, eos: int,
                    record_logprobs: bool) -> dict[str, Any]:
    """The fields of vLLM's ``SamplingParams`` for one request (``SamplingParams(**fields)`` in process, the JSON
    ``sampling_params`` of a server request)."""
    return {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed,
            "stop_token_ids": [eos], "detokenize": False, "logprobs": 0 if record_logprobs else None}


def draw_seeds(prompts: int) -> list[int]:
    """One vLLM request seed per prompt, from torch's global RNG (seeded per run and rank: runs repeat)."""
    return torch.randint(2**31 - 1, (prompts,)).tolist()


class VLLMSampler(SyncedOnResume, abc.ABC):
    """``generate`` and ``greedy`` of a vLLM engine, over its :meth:`_complete`. Subclasses set :attr:`tokenizer` (the
    learner's: its EOS stops responses, it decodes them) and :attr:`record_logprobs`. Neither engine saves its weights
    (they live under vLLM's fused names): a resume syncs it (:class:`SyncedOnResume`)."""

    tokenizer: Any
    record_logprobs: bool

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        """``n`` samples per prompt at ``sampling``'s temperature and top-p, one seeded request per prompt."""
        seeds = draw_seeds(len(prompt_ids))
        return self._complete(prompt_ids, [self._params(n, sampling.temperature, sampling.top_p,
                                                        sampling.max_new_tokens, seed) for seed in seeds])

    def greedy(self, prompt_ids: list[list[int]], max_new_tokens: int) -> list[Generation]:
        """One greedy (argmax) response per prompt."""
        return self._complete(prompt_ids, [self._params(1, 0.0, 1.0, max_new_tokens, None)] * len(prompt_ids))

    def _params(self, n: int, temperature: float, top_p: float, max_tokens: int, seed: int | None) -> dict[str, Any]:
        return sampling_params(n, temperature, top_p, max_tokens, seed, eos=self.tokenizer.eos_token_id,
                               record_logprobs=self.record_logprobs)

    @abc.abstractmethod
    def _complete(self, prompt_ids: list[list[int]], params: list[dict[str, Any]]) -> list[Generation]:
        """One request per prompt with its :func:`sampling_params` (in order); their generations, in order."""

    def _generation(self, prompt: list[int], responses: list[list[int]], logprobs: list[list[float]] | None,
                    versions: list[list[int]] | None = None) -> Generation:
        """A reply read into a :class:`Generation`: the responses' token ids decoded by the learner's tokenizer."""
        return Generation(prompt_ids=list(prompt), response_ids=responses,
                          responses=self.tokenizer.batch_decode(responses, skip_special_tokens=True),
                          token_logprobs=logprobs if self.record_logprobs else None, versions=versions)
