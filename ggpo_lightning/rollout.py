"""Rollout engines: the behavior policy that samples K responses per prompt.

An engine holds its *own* copy of the model. It changes only when the trainer calls
``load_weights`` (every ``rollout_sync_every`` optimizer updates), so between syncs it
is a stale snapshot of the learner, the behavior policy ``mu`` GGPO learns from.
``HFGenerateEngine`` is the embedded default (transformers ``generate``, KV cache,
batched, left padding); ``model.rollout.engine: vllm`` selects
:class:`~ggpo_lightning.vllm_engine.VLLMEngine`; any object with the same methods can replace it.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Union, runtime_checkable

import torch
from torch import Tensor, nn
from ggpo_verifiers import VerifierStats

from ggpo_lightning.buffer import RolloutGroup
from ggpo_lightning.logprobs import pack_sequences, token_logprobs
from ggpo_lightning.records import PromptRow

__all__ = ["Generation", "GroupRollout", "HFGenerateEngine", "RolloutConfig", "RolloutCounts", "RolloutEngine",
           "SamplingConfig", "autocast_device", "encode_prompt", "generate_responses"]


@dataclass
class SamplingConfig:
    """How the behavior policy samples responses."""

    temperature: float = 1.0
    """Softmax temperature (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    max_new_tokens: int = 256
    """Longest response in tokens; a response that reaches it without EOS is truncated."""
    generation_batch_size: int = 256
    """Sequences per ``generate`` call (bounds memory; groups are never split across calls' results)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1 or self.generation_batch_size < 1:
            raise ValueError("sampling.max_new_tokens and sampling.generation_batch_size must be >= 1")


@dataclass
class Generation:
    """The K sampled responses to one prompt (token ids end with EOS when the model stopped)."""

    prompt_ids: list[int]
    response_ids: list[list[int]]
    responses: list[str]
    token_logprobs: list[list[float]] | None
    """Per-token log-probs under the engine's model at temperature 1 (before temperature and
    top-p), when the engine records them: what ratio-based objectives (GRPO) compare against."""


Weights = Union[nn.Module, Mapping[str, Tensor], Iterable[tuple[str, Tensor]]]
"""What a rollout engine loads: a model, a state dict, or a stream of ``(name, tensor)`` pairs."""


def weight_pairs(weights: Weights) -> Iterable[tuple[str, Tensor]]:
    """``weights`` as ``(name, tensor)`` pairs: a model's or a state dict's items (by reference), or the stream
    itself."""
    if isinstance(weights, nn.Module):
        return weights.state_dict().items()
    return weights.items() if isinstance(weights, Mapping) else weights


def _copy_pairs(target: Mapping[str, Tensor], pairs: Iterable[tuple[str, Tensor]]) -> None:
    """Copy streamed ``(name, tensor)`` pairs into ``target``'s tensors (e.g. a model's state) in place; every entry
    exactly once."""
    seen = set()
    for name, tensor in pairs:
        if name not in target:
            raise KeyError(f"the engine's model has no weight named {name!r}")
        target[name].copy_(tensor)
        seen.add(name)
    if seen != target.keys():
        raise KeyError(f"weights missing from the stream: {sorted(target.keys() - seen)[:5]}")


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a rollout engine."""

    version: int
    """Optimizer step of the learner whose weights the engine holds."""

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]:
        """Sample ``n`` responses for each prompt (token ids), one ``Generation`` per prompt, in order."""
        ...

    def load_weights(self, learner: Weights, version: int) -> None:
        """Copy the learner's weights (a model, its plain ``state_dict``, e.g. LoRA-merged, or
        ``(name, tensor)`` pairs, e.g. gathered from shards) into the engine's model and record ``version``."""
        ...


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
                _copy_pairs(self.model.state_dict(), state)
        self.version = version

    def to(self, device: torch.device | str) -> HFGenerateEngine:
        self.model.to(device)
        return self

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


@dataclass
class RolloutConfig:
    """The behavior policy: how many responses, how sampled, how stale (recipe group ``model.rollout``)."""

    k: int = 8
    """Responses per prompt (the group size K, >= 2)."""
    sync_every: int = 1
    """Copy the learner into the rollout engine every N optimizer updates (1 = near on-policy)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Temperature, top-p, response length, generation batch size."""
    dtype: str | None = None
    """Precision of the rollout model (``bfloat16`` for a learner in float32 = numerics mismatch); None = the learner's."""
    engine: str = "hf"
    """``hf``: transformers ``generate`` on a copy of the learner; ``vllm``: a vLLM engine, in the trainer process or
    its own (``vllm_placement``; :mod:`~ggpo_lightning.vllm_engine`; needs ``pip install 'ggpo-lightning[vllm]'``)."""
    vllm_args: dict[str, Any] = field(default_factory=dict)
    """More ``vllm.LLM`` keyword arguments for ``engine: vllm`` (e.g. ``gpu_memory_utilization``, ``max_model_len``)."""
    vllm_placement: str = "colocated"
    """``engine: vllm``: where vLLM runs. ``colocated``: in the trainer process; ``separate``: in a child process of
    its own (:class:`~ggpo_lightning.vllm_separate.SeparateVLLMEngine`), on ``vllm_devices``; ``mode: async`` needs
    it."""
    vllm_devices: list[int] | None = None
    """``vllm_placement: separate``: the GPU (index as the trainer sees it) the engine runs on, alone; None = the
    trainer's devices (vLLM takes the first). One GPU for now; leave unset on CPU."""
    mode: str = "sync"
    """``sync``: generation and training take turns; ``async``: a producer thread generates the next steps' groups
    with the engine's current weights while the learner trains (:mod:`~ggpo_lightning.producer`; one process, online
    data; the HF engine or the separate vLLM engine)."""
    async_worker: str = "process"
    """``async`` with the HF engine: where generation runs. ``process``: a child process on the engine's weights in
    shared memory (:class:`~ggpo_lightning.child_engine.ChildProcessEngine`; CPU; the two do not share the GIL);
    ``thread``: in the producer thread itself."""
    max_staleness: int | None = None
    """``async``: the bound on ``learner step - behavior version`` of every group it trains on (the producer waits
    for fresher weights rather than run further ahead); None = ``sync_every``. At least ``sync_every - 1``."""

    def errors(self) -> list[str]:
        """Every invalid setting, each naming its recipe key (empty when valid)."""
        errors = []
        if self.k < 2:
            errors.append(f"model.rollout.k must be >= 2 (GGPO contrasts responses within a group), got {self.k}")
        if self.sync_every < 1:
            errors.append(f"model.rollout.sync_every must be >= 1, got {self.sync_every}")
        if self.dtype is not None and self.dtype not in DTYPES:
            errors.append(f"model.rollout.dtype must be one of {sorted(DTYPES)} or null, got {self.dtype!r}")
        if self.engine not in ENGINES:
            errors.append(f"model.rollout.engine must be one of {list(ENGINES)}, got {self.engine!r}")
        if self.engine == "vllm":
            from ggpo_lightning.vllm_engine import VLLM_INSTALL_HINT, vllm_available

            if not vllm_available():
                errors.append(f"model.rollout.engine: vllm needs vLLM, which is not installed: {VLLM_INSTALL_HINT}")
            errors += self._placement_errors()
        else:
            errors += [f"model.rollout.{key} is for model.rollout.engine: vllm; the engine is {self.engine!r}"
                       for key, is_set in (("vllm_args", bool(self.vllm_args)),
                                           ("vllm_placement", self.vllm_placement != "colocated"),
                                           ("vllm_devices", self.vllm_devices is not None)) if is_set]
        return errors + self._async_errors()

    def _placement_errors(self) -> list[str]:
        if self.vllm_placement not in VLLM_PLACEMENTS:
            return [f"model.rollout.vllm_placement must be one of {list(VLLM_PLACEMENTS)}, got {self.vllm_placement!r}"]
        if self.vllm_devices is None:
            return []
        if self.vllm_placement != "separate":
            return ["model.rollout.vllm_devices places the separate vLLM engine; set model.rollout.vllm_placement: "
                    "separate, or remove vllm_devices"]
        if len(self.vllm_devices) != 1 or self.vllm_devices[0] < 0:
            # the sync loads into vLLM's in-process worker; several GPUs (tensor parallelism) run workers elsewhere
            return [f"model.rollout.vllm_devices takes one GPU index (>= 0) for now, got {self.vllm_devices}"]
        return []

    def _async_errors(self) -> list[str]:
        if self.mode not in MODES:
            return [f"model.rollout.mode must be one of {list(MODES)}, got {self.mode!r}"]
        if self.mode == "sync":
            return [] if self.max_staleness is None else [
                "model.rollout.max_staleness bounds the producer of model.rollout.mode: async; the mode is 'sync' "
                "(staleness is then sync_every - 1 at most; data.max_staleness drops buffered groups)"]
        errors = []
        if self.async_worker not in ASYNC_WORKERS:
            errors.append(f"model.rollout.async_worker must be one of {list(ASYNC_WORKERS)}, got {self.async_worker!r}")
        if self.engine == "vllm" and self.vllm_placement != "separate":
            errors.append("model.rollout.mode: async with model.rollout.engine: vllm needs "
                          "model.rollout.vllm_placement: separate (a vLLM engine in the trainer process would share "
                          "one GIL with the learner); set it, or mode: sync")
        if self.max_staleness is not None and self.max_staleness < max(0, self.sync_every - 1):
            errors.append(f"model.rollout.max_staleness must be >= 0 and >= model.rollout.sync_every - 1 "
                          f"({self.sync_every - 1}: a batch can need weights that the next sync brings), got "
                          f"{self.max_staleness}")
        return errors

    @property
    def staleness_bound(self) -> int:
        """Async mode's bound on staleness: ``max_staleness``, or ``sync_every`` when unset."""
        return self.sync_every if self.max_staleness is None else self.max_staleness

    @property
    def max_lag(self) -> int:
        """The most updates a group can be behind the learner: ``sync_every - 1`` in sync mode, the bound in async."""
        return self.sync_every - 1 if self.mode == "sync" else self.staleness_bound

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return DTYPES[self.dtype] if self.dtype else None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ENGINES = ("hf", "vllm")
MODES = ("sync", "async")
ASYNC_WORKERS = ("process", "thread")
VLLM_PLACEMENTS = ("colocated", "separate")


class GroupRollout:
    """Prompts in, scored groups out: the engine's K responses per prompt and the verifier's rewards.

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

    @torch.no_grad()
    def __call__(self, rows: Sequence[PromptRow]) -> list[RolloutGroup]:
        start = time.perf_counter()
        k = self.config.k
        with _cached_weight_casts(self.engine):
            generations = self.engine.generate([self.encode(r.prompt) for r in rows], k, self.config.sampling)
        responses = [text for g in generations for text in g.responses]
        verify_start = time.perf_counter()
        rewards = self.verifier.score_batch(responses, [r.gold for r in rows for _ in range(k)])
        self.verify_seconds += time.perf_counter() - verify_start
        groups = [
            RolloutGroup(
                prompt_id=row.id, prompt=row.prompt, gold=row.gold, prompt_ids=g.prompt_ids,
                response_ids=g.response_ids, responses=g.responses,
                rewards=[float(x) for x in rewards[i * k:(i + 1) * k]],
                behavior_version=self.engine.version, behavior_logprobs=g.token_logprobs,
            )
            for i, (row, g) in enumerate(zip(rows, generations))
        ]
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


@contextlib.contextmanager
def _cached_weight_casts(engine: RolloutEngine) -> Iterator[None]:
    """Under autocast, each weight is cast to the low precision once for the whole rollout instead of at every
    generated token: Lightning's autocast disables the weight-cast cache (right for one forward and backward,
    costly for a token-by-token loop). The same casts, so the same numbers."""
    device = autocast_device(engine)
    if device is None:
        yield
        return
    try:
        with torch.autocast(device, dtype=torch.get_autocast_dtype(device), cache_enabled=True):
            yield
    finally:
        torch.clear_autocast_cache()  # the casts of this rollout's weights: the next update changes them


def autocast_device(engine: RolloutEngine) -> str | None:
    """The device type of the engine's model when autocast is on for it in this thread; None when off or for an
    engine of another framework (it does its own casts)."""
    model = getattr(engine, "model", None)
    if model is None:
        return None
    device = next(model.parameters()).device.type
    return device if torch.is_autocast_enabled(device) else None


def encode_prompt(tokenizer, text: str, chat_template: bool = False) -> list[int]:
    """Token ids of a prompt: the text as it is (base models), or as a user turn of the
    tokenizer's chat template with the generation prompt appended (instruction-tuned models)."""
    if chat_template:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    return tokenizer(text)["input_ids"]


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
