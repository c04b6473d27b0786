"""One optimizer step's prompt groups as tensors: the typed batch, its log-probs, the reference cache.

Pure torch (no Lightning). :func:`pack_step` turns ``G`` rollout groups of up to ``K``
responses into :class:`StepBatch`: padded ``[B, L]`` token rows (``B`` = responses,
response after response, group after group), optionally shared-prefix rows (one
prompt copy per group, :func:`~ggpo_lightning.core.logprobs.pack_groups`), and the
``[G, K]`` layout of rewards and masks that the objectives take.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.core.logprobs import (PackedGroups, layout_cost, pack_groups, pack_sequences, packed_shape,
                                         packed_token_logprobs, token_logprobs)
from ggpo_lightning.core.objectives import ObjectiveInputs

__all__ = ["ReferenceLogprobCache", "StepBatch", "batch_token_logprobs", "objective_inputs", "pack_step"]


@dataclass
class StepBatch:
    """The tensors of one step's groups (``G`` groups, ``B`` responses, ``L`` = longest prompt + response)."""

    groups: list[RolloutGroup]
    input_ids: Tensor  # [B, L] prompt + response, right-padded
    attention_mask: Tensor  # [B, L]
    target_mask: Tensor  # [B, L] bool, True on response tokens
    group_mask: Tensor  # [G, K] bool, True where a response is present
    rewards: Tensor  # [G, K]
    versions: Tensor  # [G] behavior version (optimizer step of the engine's weights)
    packed: PackedGroups | None = None  # shared-prefix rows of the same responses
    behavior_token_logp: Tensor | None = None  # [B, L] recorded at rollout time, 0 off the responses
    present_mask: Tensor | None = None  # [G, K] bool, every response present (group_mask leaves out masked ones)
    truncated: Tensor | None = None  # [G, K] bool, cut at max_new_tokens (False where not recorded or absent)

    def to_groups(self, per_row: Tensor) -> Tensor:
        """Scatter a ``[B, ...]`` per-response tensor into ``[G, K, ...]`` (zeros where absent)."""
        out = per_row.new_zeros(self.group_mask.shape + per_row.shape[1:])  # [G, K, ...]
        out[self.group_mask if self.present_mask is None else self.present_mask] = per_row
        return out

    def group_rows(self) -> list[list[int]]:
        """Each group's rows (its responses, group after group)."""
        ends = torch.tensor([g.k for g in self.groups]).cumsum(0).tolist()
        return [list(range(end - g.k, end)) for g, end in zip(self.groups, ends)]

    def select(self, groups: list[int]) -> tuple[StepBatch, list[int]]:
        """The groups ``groups`` (indices, whole) as a batch of their own, on padded rows cut to their longest, and
        the rows of this batch they hold (in order)."""
        rows = [r for g in groups for r in self.group_rows()[g]]
        index = torch.tensor(rows, device=self.input_ids.device)
        width = int(self.attention_mask[index].sum(-1).max())  # right-padded rows: their lengths
        cut = lambda t: None if t is None else t[index, :width]  # noqa: E731  [b, width]
        pick = lambda t: None if t is None else t[groups]  # noqa: E731  [g, ...]
        part = StepBatch([self.groups[g] for g in groups], cut(self.input_ids), cut(self.attention_mask),
                         cut(self.target_mask), pick(self.group_mask), pick(self.rewards), pick(self.versions),
                         behavior_token_logp=cut(self.behavior_token_logp), present_mask=pick(self.present_mask),
                         truncated=pick(self.truncated))
        return part, rows

    def response_lengths(self) -> Tensor:
        """Response tokens ``[G, K]`` (0 where absent): what a declared denominator counts, known before any
        forward."""
        return self.to_groups(self.target_mask.sum(-1))

    @property
    def tokens(self) -> int:
        """Prompt and response tokens of the padded rows (the step's throughput count)."""
        return int(self.attention_mask.sum())


def pack_step(groups: list[RolloutGroup], pad_id: int, device: torch.device, shared_prefix: bool = False,
              require_behavior_logp: bool = False, mask_truncated: bool = False,
              pair_cost: float | None = None) -> StepBatch:
    """Pack ``groups`` into a :class:`StepBatch` on ``device``.

    ``shared_prefix`` adds the shared-prefix rows; with a ``pair_cost``
    (:func:`~ggpo_lightning.core.logprobs.attention_pair_cost`) only when their
    :func:`~ggpo_lightning.core.logprobs.layout_cost` is below the padded rows' (a tie keeps the padded rows).
    ``mask_truncated`` leaves truncated responses out of ``group_mask`` (what the objective sees); ``present_mask``
    keeps every response (the behavior anchor's). The recorded behavior token log-probs are packed when every group
    has them; ``require_behavior_logp`` makes their absence a ValueError (e.g. a buffer file written without
    ``behavior_logprobs``).
    """
    k_max = max(g.k for g in groups)
    prompts = [g.prompt_ids for g in groups for _ in range(g.k)]
    responses = [ids for g in groups for ids in g.response_ids]
    input_ids, attention, target = pack_sequences(prompts, responses, pad_id, device)  # [B, L] each
    present = torch.tensor([[i < g.k for i in range(k_max)] for g in groups], device=device)  # [G, K]
    truncated = torch.tensor([[bool(g.truncated and g.truncated[i]) if i < g.k else False for i in range(k_max)]
                              for g in groups], device=device)  # [G, K]
    group_mask = present & ~truncated if mask_truncated else present  # [G, K]
    rewards = torch.tensor([g.rewards + [0.0] * (k_max - g.k) for g in groups], device=device)  # [G, K]
    versions = torch.tensor([g.behavior_version for g in groups], device=device)  # [G]
    batch = StepBatch(groups, input_ids, attention, target, group_mask, rewards, versions,
                      present_mask=present, truncated=truncated)
    if shared_prefix:
        group_prompts, group_responses = [g.prompt_ids for g in groups], [g.response_ids for g in groups]
        if pair_cost is None or (layout_cost(*packed_shape(group_prompts, group_responses), pair_cost)
                                 < layout_cost(*input_ids.shape, pair_cost)):  # the rows built only when kept
            batch.packed = pack_groups(group_prompts, group_responses, pad_id, device=device)
    flat = [torch.tensor(lp) for g in groups for lp in (g.behavior_logprobs or [])]
    if len(flat) != len(responses) and require_behavior_logp:
        raise ValueError("the objective needs behavior log-probs, but some groups lack them (a buffer file "
                         "without behavior_logprobs?)")
    if len(flat) == len(responses):
        if sum(len(lp) for lp in flat) != int(target.sum()):
            bad = next(g.prompt_id for g in groups for ids, lp in zip(g.response_ids, g.behavior_logprobs)
                       if len(ids) != len(lp))
            raise ValueError(f"group {bad!r}: behavior_logprobs do not match its response tokens (one log-prob "
                             "per response token)")
        behavior = torch.zeros(input_ids.shape, device=device)  # [B, L]
        batch.behavior_token_logp = behavior.masked_scatter(target, torch.cat(flat).to(device))
    return batch


def batch_token_logprobs(model: nn.Module, batch: StepBatch, chunk_size: int) -> Tensor:
    """Token log-probs ``[B, L]`` (0 off the responses) of the batch's responses under ``model``:
    on the shared-prefix rows when the batch has them, else on the padded rows; equal up to rounding."""
    if batch.packed is None:
        return token_logprobs(model, batch.input_ids, batch.attention_mask, batch.target_mask, chunk_size)
    flat = packed_token_logprobs(model, batch.packed, chunk_size)  # [N]
    return flat.new_zeros(batch.target_mask.shape).masked_scatter(batch.target_mask, flat)  # [B, L]


def objective_inputs(batch: StepBatch, token_logp: Tensor, ref_token_logp: Tensor, level: str) -> ObjectiveInputs:
    """The batch as an objective sees it: learner token log-probs ``token_logp`` (with gradient) and reference ones
    ``ref_token_logp`` (without), both ``[B, L]``, summed per response and laid out ``[G, K]``; for ``level ==
    "token"`` objectives also the ``[G, K, L]`` token fields. Behavior log-probs come from the batch (recorded at
    rollout time)."""
    behavior = batch.behavior_token_logp  # [B, L] or None
    inputs = ObjectiveInputs(logp=batch.to_groups(token_logp.sum(-1)), rewards=batch.rewards,  # [G, K]
                             mask=batch.group_mask, ref_logp=batch.to_groups(ref_token_logp.sum(-1)),  # [G, K]
                             behavior_logp=None if behavior is None else batch.to_groups(behavior.sum(-1)))  # [G, K]
    if level != "token":
        return inputs
    return replace(inputs, token_logp=batch.to_groups(token_logp),  # [G, K, L]
                   token_mask=batch.to_groups(batch.target_mask),  # [G, K, L]
                   ref_token_logp=batch.to_groups(ref_token_logp),  # [G, K, L]
                   behavior_token_logp=None if behavior is None else batch.to_groups(behavior))  # [G, K, L]


class ReferenceLogprobCache:
    """Reference token log-probs per group, valid until the next reference refresh.

    The reference is frozen between refreshes, so a group's values are computed the first
    time it is drawn and reused when it is drawn again (replay, offline data). An entry
    leaves with its group (a weak reference) or at :meth:`clear`. Reused values equal
    recomputed ones up to float rounding.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, Tensor]] = {}  # id(group) -> (group, flat [N_g])

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, group: RolloutGroup) -> Tensor | None:
        entry = self._entries.get(id(group))
        return entry[1] if entry is not None and entry[0]() is group else None

    def put(self, group: RolloutGroup, values: Tensor) -> None:
        key, entries = id(group), self._entries
        entries[key] = (weakref.ref(group, lambda _, key=key: entries.pop(key, None)), values)

    def clear(self) -> None:
        self._entries.clear()

    def token_logprobs(self, reference: nn.Module, batch: StepBatch, pad_id: int, chunk_size: int,
                       forward: Callable[[nn.Module, StepBatch], Tensor] | None = None) -> Tensor:
        """Reference token log-probs ``[B, L]`` (no grad) of the batch: only groups not cached go through
        ``reference``, by ``forward(reference, sub_batch)`` (default :func:`batch_token_logprobs`; a micro-batched
        step passes its own)."""
        missing = [g for g in batch.groups if self.get(g) is None]
        if missing:
            sub = batch if len(missing) == len(batch.groups) else pack_step(
                missing, pad_id, batch.input_ids.device, shared_prefix=batch.packed is not None)
            with torch.no_grad():
                tokens = (forward or (lambda model, b: batch_token_logprobs(model, b, chunk_size)))(reference, sub)
            sizes = [sum(len(r) for r in g.response_ids) for g in missing]
            for group, values in zip(missing, tokens[sub.target_mask].split(sizes)):  # [N_g] each
                self.put(group, values)
        flat = torch.cat([self.get(g) for g in batch.groups])  # [N]
        return flat.new_zeros(batch.target_mask.shape).masked_scatter(batch.target_mask, flat)  # [B, L]
