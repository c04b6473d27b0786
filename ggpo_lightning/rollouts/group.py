"""Prompts in, scored groups out: one rollout of K responses per prompt, with the verifier's rewards and the
counts of what it cost."""

from __future__ import annotations

import difflib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from ggpo_verifiers import VerifierStats

from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine, cached_weight_casts

__all__ = ["ChatTemplate", "GroupRollout", "RolloutCounts", "chat_messages", "chat_settings", "encode_prompt"]


class GroupRollout:
    """Prompts in, scored groups out: the engine's K responses per prompt and the verifier's rewards, each response
    flagged ``truncated`` when it reached ``max_new_tokens`` without EOS (its reward then 0 with
    ``model.rollout.truncation: zero``).

    Counts what it did: ``seconds``, ``tokens``, ``prompt_tokens`` and ``verify_seconds`` (of
    ``seconds``, the wait for the verifier) since the last :meth:`take_counts` (one step's rollout) and
    ``generated_samples`` over the run.
    ``verifier`` is set once its worker pool is started (the module's ``setup``).
    """

    def __init__(self, engine: RolloutEngine, tokenizer, config: RolloutConfig,
                 chat_template: bool | ChatTemplate = False) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.verifier = None
        self.seconds = 0.0
        self.tokens = 0
        self.verify_seconds = 0.0
        self.prompt_tokens = 0
        self.generated_samples = 0

    def encode(self, text: str, messages: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """A prompt's token ids (:func:`encode_prompt`; ``messages``: the row's conversation)."""
        return encode_prompt(self.tokenizer, text, self.chat_template, messages)

    def truncated(self, response_ids: list[int]) -> bool:
        """The response reached ``sampling.max_new_tokens`` without EOS (cut, not finished)."""
        return len(response_ids) >= self.config.sampling.max_new_tokens and (
            not response_ids or response_ids[-1] != self.tokenizer.eos_token_id)

    @torch.no_grad()
    def __call__(self, rows: Sequence[PromptRow]) -> list[RolloutGroup]:
        start = time.perf_counter()
        k = self.config.k
        version = self.engine.version  # of the weights at the call: an engine without tags keeps them throughout
        with cached_weight_casts(self.engine):
            generations = self.engine.generate([self.encode(r.prompt, r.messages) for r in rows], k, self.config.sampling)
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
                behavior_version=version if g.versions is None else min(first for first, _ in g.versions),
                behavior_logprobs=g.token_logprobs, truncated=truncated, response_versions=g.versions))
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(ids) for g in generations for ids in g.response_ids)
        self.prompt_tokens += k * sum(len(g.prompt_ids) for g in generations)
        self.generated_samples += len(responses)
        return groups

    def take_counts(self) -> RolloutCounts:
        """What was counted since the last call (then reset), the verifier's outcome counts included."""
        take_metrics = getattr(self.engine, "take_metrics", None)
        counts = RolloutCounts(self.seconds, self.tokens, self.verify_seconds, self.verifier.reset_stats(),
                               self.prompt_tokens, take_metrics() if take_metrics is not None else {})
        self.seconds, self.tokens, self.verify_seconds, self.prompt_tokens = 0.0, 0, 0.0, 0
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
    prompt_tokens: int = 0
    """Prompt tokens the responses were conditioned on (each prompt counted once per response)."""
    engine: dict[str, float] = field(default_factory=dict)
    """What the engine counted itself (vLLM servers: ``servers_alive``, ``server_retries``, ``server_resyncs``,
    ``server_restarts``, ``weight_push_seconds``); empty for engines that count nothing."""

    def for_rank(self, rank: int) -> RolloutCounts:
        """These counts as rank ``rank`` reports them when rank 0 rolled out every rank's share (the async schedule
        on several processes). The step's metrics are reduced over ranks, counts summed and times averaged
        (:func:`~ggpo_lightning.core.distributed.reduce_step_metrics`): the tokens and the verifier's outcomes stay
        on rank 0, the times and the engine's counts are every rank's."""
        if rank == 0:
            return self
        return RolloutCounts(seconds=self.seconds, verify_seconds=self.verify_seconds, engine=dict(self.engine))


@dataclass
class ChatTemplate:
    """How prompts are wrapped by the tokenizer's chat template (``model.chat_template`` as settings; ``true`` is
    these defaults): each prompt is the last user turn of its conversation, after the row's own earlier turns
    (``messages`` in the data) and a system turn."""

    system: str | None = None
    """A system prompt, put first unless the row's conversation has a system turn of its own; None = none."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """More arguments of the template, e.g. ``{"enable_thinking": false}`` for Qwen3."""


def chat_settings(chat_template: bool | ChatTemplate | dict[str, Any] | None) -> ChatTemplate | None:
    """``model.chat_template`` as :class:`ChatTemplate` (``true`` = the defaults, a dict its fields), or None when
    off (false, null)."""
    if not chat_template:
        return None
    if chat_template is True:
        return ChatTemplate()
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    return ChatTemplate(**dict(chat_template))


def chat_messages(text: str, chat: ChatTemplate, messages: Sequence[dict[str, Any]] | None = None) -> list[dict]:
    """The conversation of one prompt: the row's ``messages`` with ``text`` (the templated prompt) as the last user
    turn (replacing the row's own last user turn, which ``text`` was made from), after ``chat.system`` unless the
    row has a system turn."""
    turns = [dict(m) for m in messages or ()]
    if turns and turns[-1].get("role") == "user":
        turns.pop()
    turns.append({"role": "user", "content": text})
    if chat.system is not None and not any(t.get("role") == "system" for t in turns):
        turns.insert(0, {"role": "system", "content": chat.system})
    return turns


def chat_template_errors(tokenizer, chat_template: bool | ChatTemplate | dict[str, Any] | None, source: str,
                         key: str = "model.chat_template", kwargs_key: str | None = None) -> list[str]:
    """What keeps ``tokenizer``'s chat template from taking the settings ``chat_template`` (:func:`chat_settings`),
    each naming ``key``: no template at all, or a ``kwargs`` name that is none of the template's variables (a
    misspelt ``enable_thinking`` would be ignored by the template), with the closest variable, named as
    ``KEY.kwargs.NAME`` (or ``KWARGS_KEY NAME``: a command-line flag). ``source`` names the model."""
    chat = chat_settings(chat_template)
    if chat is None:
        return []
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return [f"{key} is on but the tokenizer of {source} has no chat template; turn {key} off (the prompt text "
                "as it is) or use a model whose tokenizer has one"]
    variables = template_variables(template)
    errors = []
    for name in sorted(set(chat.kwargs) - variables):
        close = difflib.get_close_matches(name, sorted(variables), n=1, cutoff=0.6)
        label = f"{key}.kwargs.{name}" if kwargs_key is None else f"{kwargs_key} {name}"
        errors.append(f"{label} is not a variable of the chat template of {source}, which would ignore "
                      "it" + (f"; did you mean {close[0]}?" if close else f" (its variables: {', '.join(sorted(variables))})"))
    return errors


def template_variables(template: str | dict[str, str]) -> set[str]:
    """The variables a Jinja chat template reads from its context (``messages``, ``enable_thinking``, ...); of every
    template when the tokenizer has several (a dict of named templates)."""
    from jinja2 import meta, nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' {% generation %} ... {% endgeneration %}: its body as it is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            return nodes.Scope(parser.parse_statements(("name:endgeneration",), drop_needle=True)).set_lineno(lineno)

    environment = ImmutableSandboxedEnvironment(extensions=[loopcontrols, Generation])  # as transformers renders
    sources = template.values() if isinstance(template, dict) else [template]
    return set().union(*(meta.find_undeclared_variables(environment.parse(source)) for source in sources))


def encode_prompt(tokenizer, text: str, chat_template: bool | ChatTemplate | dict[str, Any] | None = False,
                  messages: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of a prompt: the text as it is (base models; ``messages`` unused), or with a chat template
    (:func:`chat_settings`) the conversation of :func:`chat_messages` with the generation prompt appended
    (instruction-tuned models)."""
    chat = chat_settings(chat_template)
    if chat is not None:
        encoded = tokenizer.apply_chat_template(chat_messages(text, chat, messages), add_generation_prompt=True,
                                                tokenize=True, return_dict=True, **chat.kwargs)
        return list(encoded["input_ids"])
    return tokenizer(text)["input_ids"]
