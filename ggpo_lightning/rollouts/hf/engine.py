"""The embedded rollout engine: transformers ``generate`` on a private copy of the learner (KV cache, batched,
left padding), recording the behavior log-probs of the sampled tokens during sampling itself."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from transformers import (LogitsProcessor, LogitsProcessorList, StaticCache, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)
from transformers.cache_utils import Cache, DynamicLayer

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.protocol import Generation, Weights, copy_pairs

__all__ = ["HFGenerateEngine", "SampledResponses", "SampledTokenLogprobs", "StepHook", "generate_responses",
           "sample_responses"]


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

    ``before_step`` (None by default), when set, is called before every decoding step of every
    :meth:`generate` call (``t`` from 0 in each of its calls to :func:`sample_responses`, one per
    ``generation_batch_size`` rows) and may swap the model's weights mid-generation, e.g. through
    :meth:`load_weights`, which records the new version (an in-flight update, as a server fleet does).
    The responses are then tagged (:attr:`Generation.versions`) with the versions of their first and
    last token. An attribute, not an argument of :meth:`generate`, so that whoever emulates the fleet
    sets it once and the rollout code calls ``generate`` through the engine protocol unchanged.
    """

    before_step: StepHook | None = None

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
        versions: list[list[int]] = []
        was_training = self.model.training
        self.model.eval()  # a shared learner is in train mode (dropout) between rollouts
        try:
            for start in range(0, len(prompt_ids), per_call):
                chunk = sample_responses(
                    self.model, self.tokenizer, prompt_ids[start:start + per_call], sampling.max_new_tokens, n=n,
                    record_logprobs=self.record_logprobs, do_sample=True, temperature=sampling.temperature,
                    top_p=sampling.top_p, top_k=0, before_step=self.before_step, version=self.version)
                responses.extend(chunk.responses)
                logprobs.extend(chunk.logprobs or [])
                versions.extend(chunk.versions or [])
        finally:
            self.model.train(was_training)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [
            Generation(
                prompt_ids=list(prompt),
                response_ids=responses[i * n:(i + 1) * n],
                responses=texts[i * n:(i + 1) * n],
                token_logprobs=logprobs[i * n:(i + 1) * n] if self.record_logprobs else None,
                versions=versions[i * n:(i + 1) * n] if self.before_step is not None else None,
            )
            for i, prompt in enumerate(prompt_ids)
        ]


class SampledTokenLogprobs(LogitsProcessor):
    """Records ``log mu(y_t | x, y_<t)`` of every sampled token while ``generate`` samples: no second forward.

    Called at each decoding step with the model's next-token logits ``[B, V]`` before any
    sampling warper (:func:`_generate` lists it before the warpers and turns ``generate``'s own off), it
    keeps that step's log-softmax until the next call, where the token sampled from it is the
    last column of ``input_ids``; :meth:`finish` gathers the last step's token. So memory stays
    one ``[B, V]`` row block, not ``generate``'s ``[B, T, V]`` ``output_logits``. The log-probs
    are the model's own distribution (temperature 1), as the learner scores its responses.
    """

    def __init__(self) -> None:
        self._previous: Tensor | None = None  # [B, V] log-softmax of the last step
        self._columns: list[Tensor] = []  # T tensors [B, 1]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self._previous is not None:
            self._columns.append(self._previous.gather(1, input_ids[:, -1:]))  # [B, 1]
        self._previous = torch.log_softmax(scores.float(), dim=-1)  # [B, V]
        return scores

    def finish(self, sequences: Tensor) -> Tensor:
        """The sampled tokens' log-probs ``[B, T]``, given ``generate``'s output ``[B, P + T]``."""
        if self._previous is None:
            return sequences.new_zeros((sequences.shape[0], 0), dtype=torch.float32)
        columns = [*self._columns, self._previous.gather(1, sequences[:, -1:])]  # T x [B, 1]
        self._previous, self._columns = None, []
        return torch.cat(columns, dim=1)  # [B, T]


class SampledResponses(NamedTuple):
    """What :func:`sample_responses` returns (a tuple: ``result[0]`` is the responses, as before ``versions``)."""

    responses: list[list[int]]
    """``n`` responses per prompt, prompt ``i``'s at ``i*n .. i*n+n-1``, each cut after its first EOS."""
    logprobs: list[list[float]] | None
    """Each response token's log-prob under the model (its own distribution), with ``record_logprobs``; else None."""
    versions: list[list[int]] | None
    """Per response ``[first, last]``: the weight versions that sampled its first and its last token
    (:attr:`Generation.versions`), with a ``before_step`` hook; else None."""


StepHook = Callable[[int], int | None]
"""Called on the host before decoding step ``t`` (``t = 0``: the first sampled token); it may change the model's
weights in place and returns their new version, or None when they did not change."""


@torch.no_grad()
def generate_responses(model: nn.Module, tokenizer, prompts: list[list[int]], max_new_tokens: int, n: int = 1,
                       **decoding: Any) -> list[list[int]]:
    """``n`` responses per prompt (:func:`sample_responses` without log-probs; ``decoding``: its sampling
    arguments)."""
    return sample_responses(model, tokenizer, prompts, max_new_tokens, n, record_logprobs=False, **decoding).responses


@torch.no_grad()
def sample_responses(model: nn.Module, tokenizer, prompts: list[list[int]], max_new_tokens: int, n: int = 1,
                     record_logprobs: bool = False, do_sample: bool = True, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, synced_gpus: bool = False,
                     before_step: StepHook | None = None, version: int = 0) -> SampledResponses:
    """``n`` responses per prompt on left-padded prompts; prompt ``i``'s responses at ``i*n .. i*n+n-1``, each cut
    after its first EOS; with ``record_logprobs`` also each response token's log-prob under ``model`` (its own
    distribution, before temperature and top-p/top-k), else None.

    Sampling (``do_sample``) draws from the logits divided by ``temperature``, restricted to the ``top_k`` most
    likely tokens (0: all) and the smallest set of probability ``top_p``, as transformers' warpers do; else greedy.
    With ``n > 1`` the prompts' key-value cache is computed once per prompt and repeated ``n`` times, instead of
    once per response: the same attention inputs, a fraction of the prompt work.

    ``before_step`` (:data:`StepHook`) is called before each decoding step and may swap the weights mid-generation
    (an in-flight update, as a server fleet does): the tokens already in the cache keep the keys and values the old
    weights computed, and each response is tagged ``[first, last]`` with the versions (starting at ``version``) that
    sampled its first and last token (``versions``).

    Decoding is :func:`_decode`, on a preallocated cache without host round trips per token; ``synced_gpus`` (FSDP:
    every rank must run the same forwards) goes through ``model.generate`` instead, which keeps every row to the end
    (and takes no ``before_step``).
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # [G, P]
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # [G, P]
    warpers = _warpers(temperature, top_p, top_k) if do_sample else None
    step_versions: list[int] | None = None  # the weight version of each decoding step, with a hook
    if synced_gpus:
        if before_step is not None:
            raise ValueError("model.generate (synced_gpus) takes no before_step hook")
        cache: dict[str, Any] = {}  # the prompts' key-value cache as the model takes it, when computed up front
        if n > 1 and width > 1 and getattr(model.config, "use_cache", True):
            positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [G, P] as generate numbers left-padded prompts
            out = model(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1],
                        position_ids=positions[:, :-1], use_cache=True)
            cache = _cache_of(out)
            next(iter(cache.values())).batch_repeat_interleave(n)  # [G * n, ...]: generate goes on from the last token
        sampled, logprobs = _generate(model, input_ids.repeat_interleave(n, 0), attention.repeat_interleave(n, 0),
                                      cache, max_new_tokens, pad, eos, record_logprobs, warpers)
    else:
        if before_step is not None:
            step_versions = []
            before_step = _recording(before_step, version, step_versions)
        sampled, logprobs = _decode(model, input_ids, attention, n, max_new_tokens, pad, eos, record_logprobs,
                                    warpers, before_step)
    lengths = [seq.index(eos) + 1 if eos in seq else len(seq) for seq in sampled]
    responses = [seq[:length] for seq, length in zip(sampled, lengths)]
    if logprobs is not None:
        logprobs = [row[:length] for row, length in zip(logprobs, lengths)]
    versions = None if step_versions is None else [[step_versions[0], step_versions[length - 1]] for length in lengths]
    return SampledResponses(responses, logprobs, versions)


def _recording(before_step: StepHook, version: int, step_versions: list[int]) -> Callable[[int], None]:
    """``before_step`` appending the version each step samples with to ``step_versions`` (from ``version`` on): the
    versions of a response's first and last token follow from its length, read back with the tokens."""
    def hook(t: int) -> None:
        changed = before_step(t)
        step_versions.append(changed if changed is not None else step_versions[-1] if step_versions else version)
    return hook


def _cache_of(out) -> dict[str, Any]:
    """The model output's key-value cache, under the name the model's ``forward`` takes it by (transformers
    >= 5.x renamed ``past_key_values`` to ``cache``)."""
    name = "cache" if "cache" in out else "past_key_values"
    return {name: out[name]}


def _warpers(temperature: float, top_p: float, top_k: int) -> LogitsProcessorList:
    """transformers' sampling warpers in ``generate``'s order: temperature, top-k, top-p."""
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


STOP_CHECK_EVERY = 8
"""Decoding steps between two looks at the finished rows (:func:`_decode`): each look reads one value back to the host,
which on an accelerator waits for every queued kernel before the next step can be launched, so looking at every token
(what the loop did before) serialises the host and the device. Every 8 tokens the wait is amortised, and at most 7
steps are spent after the last row stopped (or on stopped rows before they are dropped). On a CPU a look costs nothing
(no queue to wait for) and those steps would: it looks at every step there (:func:`_stop_check_every`)."""


def _stop_check_every(device: torch.device) -> int:
    """Decoding steps between two looks at the finished rows on ``device``: :data:`STOP_CHECK_EVERY` on an
    accelerator, 1 on the CPU (measured on the 16-token workload of ``benchmarks/vs_trl.py``: with a look every 8 steps
    the m30 fp32 rollout took 0.70 s, its finished rows kept up to the next look, 0.36 s with a look every step)."""
    return 1 if device.type == "cpu" else STOP_CHECK_EVERY

COMPACT_BELOW = 0.875
"""At a look, the batch and its cache keep only the rows still going when they are fewer than this fraction of the
batch: finished rows cost a full row's compute until dropped (all of it on a CPU), and dropping costs one copy of the
cache (``index_select``), so not for a row or two. Measured on a CPU (one thread, the m30 shape, 256 rows, 64 tokens,
random weights, about half the rows stopping before the end): a step took about twice as long with the finished rows
kept to the end as with this; dropping them only below 1/2, or looking at every step, gained nothing (within that
busy machine's noise)."""


def _decode(model: nn.Module, input_ids: Tensor, attention: Tensor, n: int, max_new_tokens: int, pad: int, eos: int,
            record_logprobs: bool, warpers: LogitsProcessorList | None, before_step: Callable[[int], None] | None,
            ) -> tuple[list[list[int]], list[list[float]] | None]:
    """Token-by-token decoding of ``n`` responses to each of the left-padded prompts ``input_ids``/``attention``
    ``[G, P]`` (rows ``i*n .. i*n+n-1``: prompt ``i``). Returns each row's ``max_new_tokens`` sampled tokens (``pad``
    after its EOS) and, with ``record_logprobs``, their log-probs under the model (0 after EOS).

    The prompts are run once each (``G`` rows, on transformers' ``DynamicCache``), and their keys and values written
    ``n`` times into a preallocated ``StaticCache`` of ``G * n`` rows and ``P + max_new_tokens - 1`` positions (the
    last sampled token is never fed back; other layer kinds: :func:`_decoding_cache`), with the attention mask beside
    it, filled as decoding goes. Then nothing is reallocated per token, and nothing is read back to the host but
    once every :data:`STOP_CHECK_EVERY` steps, a look (every row finished? drop the finished rows, below
    :data:`COMPACT_BELOW`?; on the CPU, where a read-back waits for nothing, at every step:
    :func:`_stop_check_every`): the tokens and log-probs are written on the device into ``[B, T]`` tensors and
    copied to the host once at the end. ``before_step(t)`` is called before step ``t`` samples (before the forward
    that gives its logits).

    The draws are :func:`torch.multinomial`'s over all ``B`` rows at every step (:func:`_draw`), dropped rows
    included, as ``generate`` draws: the same random stream, so the same responses as ``generate`` for a seed. The
    steps run after every row finished (up to the next look) draw too; the stream is then set back to where it was
    after the last step that had a row going (:class:`_RandomStream`), so what samples next (the next rollout) draws
    as it did when the loop stopped at once.
    """
    groups, width = input_ids.shape
    batch = groups * n
    if before_step is not None:
        before_step(0)
    name, cache, grows, mask, position, logits = _prefill(model, input_ids, attention, n, width + max_new_tokens - 1)
    tokens = input_ids.new_full((batch, max_new_tokens), pad)  # [B, T]
    logprobs = logits.new_zeros((batch, max_new_tokens)) if record_logprobs else None  # [B, T]
    rows = torch.arange(batch, device=input_ids.device)  # [b] each batch row's response
    going = torch.ones(batch, dtype=torch.bool, device=input_ids.device)  # [b] not finished
    broken = torch.zeros((), dtype=torch.bool, device=input_ids.device)  # [] a going row's logits not finite
    active = torch.zeros((), dtype=torch.long, device=input_ids.device)  # [] steps begun with a row going
    stream = _RandomStream(input_ids.device) if warpers is not None else None
    every = _stop_check_every(input_ids.device)
    for t in range(max_new_tokens):
        broken = broken | (going & ~torch.isfinite(logits).all(-1)).any()  # []
        active = active + going.any()  # []
        chosen = logits.argmax(-1) if stream is None else _draw(warpers(None, logits), rows, batch)  # [b]
        if stream is not None:
            stream.drawn()
        chosen = torch.where(going, chosen, pad)  # [b]
        tokens[rows, t] = chosen  # [B, T] column t, at the rows still in the batch
        if logprobs is not None:
            picked = torch.log_softmax(logits, -1).gather(1, chosen[:, None]).squeeze(1)  # [b]
            logprobs[rows, t] = torch.where(going, picked, 0.0)  # [B, T] column t
        going = going & (chosen != eos)  # [b]
        if t + 1 == max_new_tokens:
            break
        if (t + 1) % every == 0:
            still, bad = torch.stack([going.sum(), broken.long()]).tolist()  # the one read-back of these steps
            _check_finite(bad, t)
            if still == 0:
                break
            if stream is not None:
                stream.all_kept(t)
            if still < COMPACT_BELOW * len(going):  # finished rows leave the batch and the cache
                keep = going.nonzero().squeeze(1)  # [b']
                cache.reorder_cache(keep)
                rows, chosen, mask, position, going = rows[keep], chosen[keep], mask[keep], position[keep], going[keep]
        mask[:, width + t] = 1  # [b, P + T - 1]: the position of step t's token
        position = position + 1  # [b]
        if before_step is not None:
            before_step(t + 1)
        seen = mask[:, :width + t + 1] if grows else mask  # [b, P + t + 1] or [b, P + T - 1]
        out = model(input_ids=chosen[:, None], attention_mask=seen, position_ids=position[:, None], use_cache=True,
                    **{name: cache})
        logits = out.logits[:, -1, :].float()  # [b, V]
    bad, steps = torch.stack([broken.long(), active]).tolist()
    _check_finite(bad, t)
    if stream is not None:
        stream.rewind(steps)
    return tokens.tolist(), None if logprobs is None else logprobs.tolist()


def _prefill(model: nn.Module, input_ids: Tensor, attention: Tensor, n: int, length: int,
             ) -> tuple[str, Cache, bool, Tensor, Tensor, Tensor]:
    """The prompts ``[G, P]`` run once each, and the decoding state of their ``B = G * n`` rows: the name of the
    model's cache argument, the cache holding each prompt ``n`` times over ``length`` positions and whether it grows
    (:func:`_decoding_cache`), the attention mask ``[B, length]`` with the prompts' part filled, each row's position
    of the last token fed ``[B]``, and the logits of the first decoding step ``[B, V]``."""
    keep_logits = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [G, P] as generate numbers left-padded prompts
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                **keep_logits)
    (name, prompts_cache), = _cache_of(out).items()
    cache, grows = _decoding_cache(prompts_cache, model.config, n, length)
    mask = attention.new_zeros((len(input_ids) * n, length))  # [B, P + T - 1]
    mask[:, :input_ids.shape[1]] = attention.repeat_interleave(n, 0)  # [B, P]
    position = positions[:, -1].repeat_interleave(n, 0)  # [B] of the last token fed
    logits = out.logits[:, -1, :].float().repeat_interleave(n, 0)  # [B, V]
    return name, cache, grows, mask, position, logits


def _decoding_cache(prompts_cache: Cache, config: Any, n: int, length: int) -> tuple[Cache, bool]:
    """The cache the decoding steps write into, holding each prompt's keys and values ``n`` times (rows ``i*n ..
    i*n+n-1``: prompt ``i``), and whether it grows by a position per step (its attention mask is then cut to its
    length at each step).

    A ``StaticCache`` of ``length`` positions when every layer of the prompts' cache is a plain full-attention
    ``DynamicLayer``; otherwise (sliding-window attention layers, which keep only the window, linear-attention or
    indexed layers) transformers' own cache of the prompts, repeated in place: it grows at every token as the loop
    before issue 42 did, and such models decode as they did then."""
    if not all(type(layer) is DynamicLayer for layer in prompts_cache.layers):
        prompts_cache.batch_repeat_interleave(n)
        return prompts_cache, True
    cache = StaticCache(config=config, max_cache_len=length)
    for index, layer in enumerate(prompts_cache.layers):
        cache.update(layer.keys.repeat_interleave(n, 0), layer.values.repeat_interleave(n, 0),
                     index)  # [B, heads, P, head_dim] into positions 0 .. P - 1
    return cache, False


class _RandomStream:
    """The random generator's states after the draws since the last look at the finished rows: every draw up to a
    look that found a row going was one the loop before issue 42's rewrite made too; the later ones may not be."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.first = 0  # the step of states[0]
        self.states: list[Tensor] = []  # after the draws of steps first, first + 1, ...

    def drawn(self) -> None:
        """Keep the state after this step's draw (a few kilobytes copied on the host; no device sync)."""
        self.states.append(torch.cuda.get_rng_state(self.device) if self.cuda else torch.get_rng_state())

    def all_kept(self, step: int) -> None:
        """A look after ``step`` found rows going: the draws so far stay."""
        self.first, self.states = step + 1, []

    def rewind(self, steps: int) -> None:
        """Set the generator to its state after the draw of step ``steps - 1``, the last begun with a row going."""
        index = steps - 1 - self.first
        if 0 <= index < len(self.states) - 1:
            if self.cuda:
                torch.cuda.set_rng_state(self.states[index], self.device)
            else:
                torch.set_rng_state(self.states[index])


def _check_finite(broken: bool, step: int) -> None:
    """Raise when a row still going had NaN or infinite logits by decoding step ``step``: sampled from, they would
    give arbitrary tokens (``torch.multinomial``'s own check, which :func:`_draw` skips, raised here before)."""
    if broken:
        raise FloatingPointError(f"the rollout model's next-token logits are NaN or infinite (by decoding step {step}): "
                                 "its weights or the prompts' inputs are broken; no response of this call is kept")


def _draw(scores: Tensor, rows: Tensor, batch: int) -> Tensor:
    """One token per row from ``softmax(scores)`` ``[b, V]`` (``rows``: the batch rows of ``batch`` they are), drawn
    as ``torch.multinomial(probs, 1)`` draws over all ``batch`` rows: ``argmax(probs / E)`` with ``E`` ``[batch, V]``
    exponential noise, row ``i``'s draw depending on row ``i``'s probabilities only (``torch.multinomial``'s own
    method for one sample, so the same tokens for a seed). Without its check that the probabilities are valid, which
    reads a value back to the host at every call."""
    probs = torch.softmax(scores, dim=-1)  # [b, V]
    noise = torch.empty((batch, probs.shape[1]), dtype=probs.dtype, device=probs.device).exponential_(1)  # [B, V]
    return (probs / noise[rows]).argmax(-1)  # [b]


def _generate(model: nn.Module, input_ids: Tensor, attention: Tensor, cache: dict[str, Any], max_new_tokens: int,
              pad: int, eos: int, record_logprobs: bool, warpers: LogitsProcessorList | None,
              ) -> tuple[list[list[int]], list[list[float]] | None]:
    """:func:`_decode`'s contract through ``model.generate`` with ``synced_gpus`` (FSDP: every rank runs the same
    forwards, so every row goes on to the end)."""
    recorder = SampledTokenLogprobs() if record_logprobs else None
    processors = LogitsProcessorList([recorder] if recorder else [])
    decoding = {"do_sample": False} if warpers is None else {"do_sample": True, "temperature": 1.0, "top_p": 1.0,
                                                             "top_k": 0}
    processors.extend(warpers or [])  # after the recorder: it keeps the model's own distribution
    result = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                            pad_token_id=pad, eos_token_id=eos, logits_processor=processors, synced_gpus=True,
                            **cache, **decoding)
    sampled = result[:, input_ids.shape[1]:]  # [B, T]
    return sampled.tolist(), None if recorder is None else recorder.finish(result).tolist()
