"""Behavior buffer: prompt groups produced by a (possibly stale) behavior policy.

A :class:`RolloutGroup` is the unit of GGPO data: K responses to one prompt, their
verifier rewards and the optimizer step of the policy that generated them. A
:class:`BehaviorBuffer` holds groups between rollout and training, decides which ones a
training step sees (``fifo``, ``newest`` or ``uniform`` replay, with an optional staleness
limit), is saved inside checkpoints (``state_dict``) and reads and writes JSONL files, so
an offline dataset is just a buffer file.

Plain Python on purpose (no torch, no Lightning): the buffer knows nothing of models.
Groups are never ordered or compared by reward: binary rewards tie constantly, and a heap
of ``(score, group)`` raises TypeError on the first tie (the bug in TRL's replay buffer).

JSONL format (UTF-8, one JSON object per line)::

    {"format": "ggpo-behavior-buffer", "format_version": 1}          <- header, optional
    {"prompt_id": "p0", "prompt": "...", "gold": "...", "prompt_ids": [...],
     "response_ids": [[...], ...], "responses": [...], "rewards": [...],
     "behavior_version": 0, "behavior_logprobs": null}               <- one group per line

A file holds data only; draw state (counters, RNG, the uniform pass) lives in
``state_dict``, which is what a resumed run restores.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import random
from dataclasses import dataclass, fields
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ggpo_lightning.records.errors import DataError
from ggpo_lightning.records.atomic import atomic_open

__all__ = ["DRAW_POLICIES", "FORMAT", "FORMAT_VERSION", "BehaviorBuffer", "RolloutGroup"]

FORMAT = "ggpo-behavior-buffer"
FORMAT_VERSION = 1
DRAW_POLICIES = ("fifo", "newest", "uniform")
_COUNTERS = ("added", "drawn", "evicted", "dropped_stale", "passes")


# ----------------------------------------------------------------------------- validation


def _is_int(x: object) -> bool:
    # bool is an int subclass; a True where a token id or version belongs is a bug upstream.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _invalid(where: str, field: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {field} {problem}")


def _as_list(value: object, field: str, where: str) -> list:
    """A copy of ``value`` as a list; lists and tuples only (a str is not a token list)."""
    if not isinstance(value, (list, tuple)):
        raise _invalid(where, field, f"must be a list, got {type(value).__name__}")
    return list(value)


def _token_ids(value: object, field: str, where: str) -> list[int]:
    ids = _as_list(value, field, where)
    # Fast path (C-level loops): a group holds K x thousands of tokens, offline files many groups.
    if set(map(type, ids)) <= {int} and (not ids or min(ids) >= 0):
        return ids
    for t, tok in enumerate(ids):
        if not _is_int(tok) or tok < 0:
            raise _invalid(where, f"{field}[{t}]", f"must be a token id (int >= 0), got {tok!r}")
    return [int(tok) for tok in ids]  # int(): numpy/torch-style integers become JSON-safe ints


def _finite_floats(value: object, field: str, where: str) -> list[float]:
    xs = _as_list(value, field, where)
    if set(map(type, xs)) <= {float} and all(map(math.isfinite, xs)):
        return xs
    for t, x in enumerate(xs):
        # Non-finite values would poison the loss and are not valid JSON either.
        if not _is_real(x) or not math.isfinite(x):
            raise _invalid(where, f"{field}[{t}]", f"must be a finite number, got {x!r}")
    return [float(x) for x in xs]


def _strings(value: object, field: str, where: str) -> list[str]:
    xs = _as_list(value, field, where)
    for i, x in enumerate(xs):
        if not isinstance(x, str):
            raise _invalid(where, f"{field}[{i}]", f"must be a str, got {type(x).__name__}")
    return xs


def _check_length(items: list, field: str, k: int, where: str) -> None:
    if len(items) != k:
        raise _invalid(where, field, f"has {len(items)} entries, expected K={k} "
                       "(one per response in response_ids)")


# ----------------------------------------------------------------------------- RolloutGroup


@dataclass
class RolloutGroup:
    """K behavior responses to one prompt, with rewards and where they came from.

    Validated on construction (``ValueError`` naming the field and ``prompt_id``): K >= 1;
    ``responses``, ``rewards`` and ``behavior_logprobs`` (when given) have K entries;
    ``behavior_logprobs[i]`` has one entry per token of ``response_ids[i]``; token ids are
    ints >= 0, rewards and log-probs finite numbers, ``behavior_version`` an int >= 0.
    Tuples are accepted and stored as lists, numbers are stored as ``int``/``float``.

    Groups compare equal field by field but define no ordering, and they are mutable:
    treat groups returned by a buffer as read-only.
    """

    prompt_id: str
    """Identifier of the prompt; several groups may share one (re-rollouts at later versions)."""
    prompt: str
    """The prompt text as shown to the model (after templating)."""
    gold: str
    """The reference answer the verifier scores against."""
    prompt_ids: list[int]
    """Prompt token ids as fed to the model, BOS included."""
    response_ids: list[list[int]]
    """K responses' token ids (EOS included when generated)."""
    responses: list[str]
    """K decoded response texts."""
    rewards: list[float]
    """K rewards."""
    behavior_version: int
    """Optimizer step of the policy that generated the responses (0 = the initial model)."""
    behavior_logprobs: list[list[float]] | None = None
    """Per-token log-probs under the behavior policy, when the engine reports them."""
    truncated: list[bool] | None = None
    """Per response: it reached ``max_new_tokens`` without EOS (None: not recorded, e.g. an older buffer file)."""
    response_versions: list[list[int]] | None = None
    """Per response: ``[first, last]``, the versions of the weights that sampled its first and its last token, when
    the engine reports them (a vLLM server updated while it generates: ``first < last``). ``behavior_version`` is then
    the oldest first version of the group. None: the whole group came from ``behavior_version``."""

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_id, str):
            raise ValueError(f"RolloutGroup: prompt_id must be a str, got "
                             f"{type(self.prompt_id).__name__} ({self.prompt_id!r})")
        where = f"RolloutGroup {self.prompt_id!r}"
        for name in ("prompt", "gold"):
            if not isinstance(getattr(self, name), str):
                raise _invalid(where, name, f"must be a str, got {type(getattr(self, name)).__name__}")
        self.prompt_ids = _token_ids(self.prompt_ids, "prompt_ids", where)
        responses_ids = _as_list(self.response_ids, "response_ids", where)
        if not responses_ids:
            raise _invalid(where, "response_ids", "is empty; a group needs K >= 1 responses")
        self.response_ids = [_token_ids(r, f"response_ids[{i}]", where) for i, r in enumerate(responses_ids)]
        k = len(self.response_ids)
        self.responses = _strings(self.responses, "responses", where)
        _check_length(self.responses, "responses", k, where)
        self.rewards = _finite_floats(self.rewards, "rewards", where)
        _check_length(self.rewards, "rewards", k, where)
        if not _is_int(self.behavior_version) or self.behavior_version < 0:
            raise _invalid(where, "behavior_version", "must be an int >= 0 (the optimizer step of the "
                           f"generating policy; 0 for the initial model), got {self.behavior_version!r}")
        self.behavior_version = int(self.behavior_version)
        if self.behavior_logprobs is not None:
            self.behavior_logprobs = self._checked_logprobs(where)
        if self.truncated is not None:
            flags = _as_list(self.truncated, "truncated", where)
            _check_length(flags, "truncated", k, where)
            if not all(isinstance(f, bool) for f in flags):
                raise _invalid(where, "truncated", f"must be K booleans, got {flags!r}")
            self.truncated = list(flags)
        if self.response_versions is not None:
            self.response_versions = self._checked_versions(where)

    def _checked_versions(self, where: str) -> list[list[int]]:
        spans = _as_list(self.response_versions, "response_versions", where)
        _check_length(spans, "response_versions", self.k, where)
        checked = [_as_list(span, f"response_versions[{i}]", where) for i, span in enumerate(spans)]
        for i, span in enumerate(checked):
            if len(span) != 2 or not all(_is_int(v) and v >= self.behavior_version for v in span) or span[0] > span[1]:
                raise _invalid(where, f"response_versions[{i}]", "must be [first, last]: ints with behavior_version "
                               f"<= first <= last, got {span!r}")
        return [[int(first), int(last)] for first, last in checked]

    def _checked_logprobs(self, where: str) -> list[list[float]]:
        outer = _as_list(self.behavior_logprobs, "behavior_logprobs", where)
        _check_length(outer, "behavior_logprobs", self.k, where)
        checked = [_finite_floats(lp, f"behavior_logprobs[{i}]", where) for i, lp in enumerate(outer)]
        for i, (lp, ids) in enumerate(zip(checked, self.response_ids)):
            if len(lp) != len(ids):
                raise _invalid(where, f"behavior_logprobs[{i}]", f"has {len(lp)} entries but "
                               f"response_ids[{i}] has {len(ids)} tokens; give one log-prob per token")
        return checked

    @property
    def k(self) -> int:
        """Number of responses in the group."""
        return len(self.response_ids)

    @property
    def mixed(self) -> bool:
        """True when the rewards are not all equal (only such groups carry a GGPO signal)."""
        return any(r != self.rewards[0] for r in self.rewards)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict of all fields (fresh lists; mutating it leaves the group intact)."""
        return {
            "prompt_id": self.prompt_id,
            "prompt": self.prompt,
            "gold": self.gold,
            "prompt_ids": list(self.prompt_ids),
            "response_ids": [list(r) for r in self.response_ids],
            "responses": list(self.responses),
            "rewards": list(self.rewards),
            "behavior_version": self.behavior_version,
            "behavior_logprobs": (None if self.behavior_logprobs is None
                                  else [list(lp) for lp in self.behavior_logprobs]),
            "truncated": None if self.truncated is None else list(self.truncated),
            "response_versions": None if self.response_versions is None else [list(v) for v in self.response_versions],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutGroup:
        """Inverse of :meth:`to_dict`; ``behavior_logprobs``, ``truncated`` and ``response_versions`` may be absent.

        Raises ValueError for a non-mapping, a missing or unknown key, or any field that
        fails validation.
        """
        if not isinstance(data, Mapping):
            raise DataError(f"a RolloutGroup record must be a JSON object, got {type(data).__name__}")
        where = f"RolloutGroup {data.get('prompt_id')!r}"
        missing = [name for name in _REQUIRED_FIELDS if name not in data]
        if missing:
            raise DataError(f"{where}: missing field(s) {', '.join(missing)}; required fields are "
                            f"{', '.join(_REQUIRED_FIELDS)} (behavior_logprobs, truncated and response_versions are optional)")
        unknown = sorted(map(str, set(data) - set(_FIELDS)))
        if unknown:
            raise DataError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                            f"valid fields are {', '.join(_FIELDS)}")
        return cls(**data)


_FIELDS = tuple(f.name for f in fields(RolloutGroup))
_REQUIRED_FIELDS = tuple(name for name in _FIELDS if name not in ("behavior_logprobs", "truncated", "response_versions"))


# ----------------------------------------------------------------------------- BehaviorBuffer


def _check_settings(capacity: object, draw: object, max_staleness: object, seed: object) -> None:
    if capacity is not None and (not _is_int(capacity) or capacity < 1):
        raise ValueError(f"capacity must be None (unbounded) or an int >= 1, got {capacity!r}")
    if draw not in DRAW_POLICIES:
        raise ValueError(f"draw must be one of {', '.join(map(repr, DRAW_POLICIES))}, got {draw!r}")
    if max_staleness is not None and (not _is_int(max_staleness) or max_staleness < 0):
        raise ValueError(f"max_staleness must be None (no limit) or an int >= 0, got {max_staleness!r}")
    if not _is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")


class BehaviorBuffer:
    """Stores :class:`RolloutGroup` s in insertion order and serves them to training.

    Args:
        capacity: most groups kept; adding beyond it evicts the oldest (counted as
            ``evicted``). None = unbounded.
        draw: how :meth:`draw` picks groups (see there): ``"fifo"``, ``"newest"`` or
            ``"uniform"``.
        max_staleness: before each draw, groups with
            ``current_version - behavior_version > max_staleness`` are dropped (counted as
            ``dropped_stale``). None = no limit; 0 = only groups of the current policy.
        seed: seeds the buffer's own RNG (used by ``uniform`` only). Draws are a
            deterministic function of the seed and the sequence of calls.
    """

    def __init__(self, capacity: int | None = None, draw: str = "fifo",
                 max_staleness: int | None = None, seed: int = 0) -> None:
        _check_settings(capacity, draw, max_staleness, seed)
        self._capacity = capacity
        self._draw_policy = draw
        self._max_staleness = max_staleness
        self._rng = random.Random(seed)
        # Sequence number -> group. Dicts keep insertion order, which is the age order.
        self._store: dict[int, RolloutGroup] = {}
        self._next_seq = 0
        # uniform only: sequence numbers still due in the current pass, drawn from the end.
        # Holds live groups only (removals prune it), so state_dict captures it exactly.
        self._pass: list[int] = []
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._last_staleness = (0.0, 0.0)  # (mean, max) of the last non-empty draw

    # ------------------------------------------------------------------ settings

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def draw_policy(self) -> str:
        return self._draw_policy

    @property
    def max_staleness(self) -> int | None:
        return self._max_staleness

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return (f"BehaviorBuffer(size={len(self)}, capacity={self._capacity}, "
                f"draw={self._draw_policy!r}, max_staleness={self._max_staleness})")

    # ------------------------------------------------------------------ adding and removing

    def add(self, groups: Iterable[RolloutGroup]) -> None:
        """Append ``groups`` (newest last), then evict the oldest beyond ``capacity``.

        All items are checked before any is stored: a TypeError leaves the buffer unchanged.
        Under ``uniform``, groups added while a pass is under way are shuffled into the rest
        of that pass (so they are drawn in it); otherwise they join the next pass.
        """
        if isinstance(groups, RolloutGroup):
            raise TypeError("add() takes an iterable of RolloutGroup; wrap a single group: add([group])")
        new = list(groups)
        for i, group in enumerate(new):
            if not isinstance(group, RolloutGroup):
                raise TypeError(f"add(): item {i} is a {type(group).__name__}, expected RolloutGroup "
                                "(build one from a dict with RolloutGroup.from_dict)")
        for group in new:
            self._insert(group)
        self._evict_over_capacity()

    def _insert(self, group: RolloutGroup) -> None:
        seq = self._next_seq
        self._next_seq += 1
        self._store[seq] = group
        self._counters["added"] += 1
        if self._pass:
            # Insertion at a uniform position keeps the remainder a uniform random permutation.
            self._pass.insert(self._rng.randrange(len(self._pass) + 1), seq)

    def _evict_over_capacity(self) -> None:
        if self._capacity is not None and len(self._store) > self._capacity:
            oldest = list(islice(self._store, len(self._store) - self._capacity))
            self._remove(oldest, "evicted")

    def _drop_stale(self, current_version: int) -> None:
        if self._max_staleness is None:
            return
        stale = [seq for seq, group in self._store.items()
                 if current_version - group.behavior_version > self._max_staleness]
        self._remove(stale, "dropped_stale")

    def _remove(self, seqs: list[int], counter: str) -> None:
        for seq in seqs:
            del self._store[seq]
        self._counters[counter] += len(seqs)
        if seqs and self._pass:
            gone = set(seqs)
            self._pass = [seq for seq in self._pass if seq not in gone]

    # ------------------------------------------------------------------ drawing

    def draw(self, n: int, current_version: int) -> list[RolloutGroup]:
        """Return up to ``n`` groups for a training step of policy ``current_version``.

        First, with ``max_staleness`` set, every group with
        ``current_version - behavior_version > max_staleness`` is dropped (a group newer
        than ``current_version``, e.g. from an offline file of a longer run, has negative
        staleness and is never dropped). Then, by policy:

        - ``fifo``: remove and return the ``n`` oldest groups, oldest first (a queue: each
          group is used once).
        - ``newest``: remove and return the ``n`` newest groups, newest first; older ones
          stay and may later age out through ``max_staleness`` or ``capacity``.
        - ``uniform``: return groups sampled without replacement and keep them stored
          (replay, offline training). Draws walk through passes: a pass is a random
          permutation of all stored groups, so every group is drawn exactly once per pass
          (groups added mid-pass are shuffled into it; removed ones leave it). When a pass
          ends inside a draw, the next one starts with this draw's groups last, so a draw
          never repeats a group unless ``n > len(self)``; then it cycles through as many
          passes as needed and returns exactly ``n`` groups.

        Fewer than ``n`` groups (possibly none) come back when fewer are stored under
        ``fifo``/``newest``, or when the buffer is empty; the caller refills. Raises
        ValueError for ``n < 1`` or a non-int ``current_version``.
        """
        if not _is_int(n) or n < 1:
            raise ValueError(f"draw(): n must be an int >= 1 (the number of groups), got {n!r}")
        if not _is_int(current_version):
            raise ValueError("draw(): current_version must be an int (the learner's optimizer step), "
                             f"got {current_version!r}")
        self._drop_stale(current_version)
        if self._draw_policy == "uniform":
            drawn = self._draw_uniform(n)
        else:
            drawn = self._consume(n, newest=self._draw_policy == "newest")
        self._record_draw(drawn, current_version)
        return drawn

    def _consume(self, n: int, newest: bool) -> list[RolloutGroup]:
        order: Iterator[int] = reversed(self._store) if newest else iter(self._store)
        taken = list(islice(order, n))
        return [self._store.pop(seq) for seq in taken]

    def _draw_uniform(self, n: int) -> list[RolloutGroup]:
        taken: list[int] = []
        while len(taken) < n and self._store:
            if not self._pass:
                self._start_pass(already_drawn=set(taken))
            taken.append(self._pass.pop())
        return [self._store[seq] for seq in taken]

    def _start_pass(self, already_drawn: set[int]) -> None:
        order = list(self._store)
        self._rng.shuffle(order)
        # We pop from the end, so the front is drawn last: this draw's groups go there.
        self._pass = ([seq for seq in order if seq in already_drawn]
                      + [seq for seq in order if seq not in already_drawn])
        self._counters["passes"] += 1

    def _record_draw(self, drawn: list[RolloutGroup], current_version: int) -> None:
        self._counters["drawn"] += len(drawn)
        if drawn:
            ages = [current_version - group.behavior_version for group in drawn]
            self._last_staleness = (sum(ages) / len(ages), float(max(ages)))

    # ------------------------------------------------------------------ inspection

    def groups(self) -> list[RolloutGroup]:
        """A new list of the stored groups, oldest first (the groups themselves are shared)."""
        return list(self._store.values())

    def stats(self) -> dict[str, float]:
        """Numbers for logging, all floats.

        ``size``; running totals ``added``, ``drawn``, ``evicted`` (capacity),
        ``dropped_stale`` (max_staleness), ``passes`` (uniform passes started); and
        ``staleness_mean`` / ``staleness_max``: ``current_version - behavior_version`` over
        the groups of the last non-empty draw (0.0 before the first one).
        """
        out = {"size": float(len(self))}
        out.update({name: float(value) for name, value in self._counters.items()})
        out["staleness_mean"], out["staleness_max"] = self._last_staleness
        return out

    # ------------------------------------------------------------------ state (checkpoints)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue drawing exactly as this buffer would: the groups,
        the uniform pass, counters and RNG state. JSON-serializable (plain lists/dicts).
        Settings are not included: they belong to the constructor (see load_state_dict)."""
        index = {seq: i for i, seq in enumerate(self._store)}
        version, internal, gauss_next = self._rng.getstate()
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "groups": [group.to_dict() for group in self._store.values()],
            "pass": [index[seq] for seq in self._pass],
            "rng": [version, list(internal), gauss_next],
            "counters": dict(self._counters),
            "last_staleness": list(self._last_staleness),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace contents, uniform pass, counters and RNG with those of ``state``.

        This buffer keeps its own settings (capacity, draw, max_staleness), so a resumed
        run may change them; with unchanged settings it draws exactly as the saved buffer
        would have. Groups beyond this buffer's capacity are evicted, oldest first. The
        state is checked in full before anything changes; errors are ValueErrors.
        """
        _check_header(state, "state_dict")
        groups = _groups_from_state(state)
        order = _pass_from_state(state, len(groups))
        rng = _rng_from_state(state)
        counters = _counters_from_state(state)
        staleness = _require(state, "last_staleness")
        if (not isinstance(staleness, (list, tuple)) or len(staleness) != 2
                or not all(_is_real(x) for x in staleness)):
            raise ValueError(f"state_dict['last_staleness'] must be [mean, max], got {staleness!r}")
        self._store = dict(enumerate(groups))
        self._next_seq = len(groups)
        # A pass only means something to uniform draws; other policies must not maintain one.
        self._pass = order if self._draw_policy == "uniform" else []
        self._rng = rng
        self._counters = counters
        self._last_staleness = (float(staleness[0]), float(staleness[1]))
        self._evict_over_capacity()

    # ------------------------------------------------------------------ JSONL files

    def save_jsonl(self, path: str | os.PathLike[str]) -> None:
        """Write a header line, then one group per line, oldest first (UTF-8).

        Atomic: the lines go to a temporary file in the same directory, which replaces
        ``path`` only once fully written and synced; on any error ``path`` is left as it
        was and the temporary file is removed. Parent directories are created.
        """
        with atomic_open(path) as f:
            f.write(_dumps({"format": FORMAT, "format_version": FORMAT_VERSION}) + "\n")
            for group in self._store.values():
                f.write(_dumps(group.to_dict()) + "\n")

    @classmethod
    def load_jsonl(cls, path: str | os.PathLike[str], **kwargs: Any) -> BehaviorBuffer:
        """A new buffer built with ``kwargs`` (the constructor's settings) holding the
        groups of a JSONL file, in file order.

        Blank lines are skipped. Header lines (objects with a ``"format"`` key) may appear
        on any line, so ``cat a.jsonl b.jsonl > c.jsonl`` is a valid file; files without
        one load too. A group beyond ``capacity`` evicts the oldest, as with :meth:`add`.
        Errors (invalid UTF-8, bad JSON, unknown format version, missing field, wrong
        type) are ValueErrors starting with ``path:line:``.
        """
        buffer = cls(**kwargs)
        buffer.add(_read_groups(Path(path)))
        return buffer


# ----------------------------------------------------------------------------- helpers


def _dumps(obj: object) -> str:
    # allow_nan=False: NaN/Infinity are not JSON; validation already rules them out.
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def _check_header(record: Mapping[str, Any], where: str) -> None:
    if not isinstance(record, Mapping) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, Mapping) else type(record).__name__
        raise DataError(f"{where}: not a behavior buffer (format {found!r}, expected {FORMAT!r})")
    if record.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{where}: unsupported format_version {record.get('format_version')!r}; "
                        f"this version of ggpo-lightning reads format_version {FORMAT_VERSION}")


def _read_groups(path: Path) -> list[RolloutGroup]:
    groups = []
    with open(path, "rb") as f:  # bytes, so that a decoding error still knows its line
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8").strip()
                if not text:
                    continue
                record = json.loads(text)
                if isinstance(record, dict) and "format" in record:
                    _check_header(record, "header")
                    continue
                groups.append(RolloutGroup.from_dict(record))
            except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                raise DataError(f"{path}:{lineno}: {err}") from err
    return groups


def _require(state: Mapping[str, Any], key: str) -> Any:
    if key not in state:
        raise ValueError(f"state_dict is missing key {key!r}; pass a dict returned by "
                         "BehaviorBuffer.state_dict()")
    return state[key]


def _groups_from_state(state: Mapping[str, Any]) -> list[RolloutGroup]:
    records = _require(state, "groups")
    if not isinstance(records, (list, tuple)):
        raise ValueError(f"state_dict['groups'] must be a list, got {type(records).__name__}")
    groups = []
    for i, record in enumerate(records):
        try:
            groups.append(RolloutGroup.from_dict(record))
        except ValueError as err:
            raise ValueError(f"state_dict['groups'][{i}]: {err}") from err
    return groups


def _pass_from_state(state: Mapping[str, Any], n_groups: int) -> list[int]:
    order = _require(state, "pass")
    if (not isinstance(order, (list, tuple)) or len(set(order)) != len(order)
            or not all(_is_int(i) and 0 <= i < n_groups for i in order)):
        raise ValueError(f"state_dict['pass'] must list distinct group indices in [0, {n_groups}), "
                         f"got {order!r}")
    return [int(i) for i in order]


def _rng_from_state(state: Mapping[str, Any]) -> random.Random:
    saved = _require(state, "rng")
    rng = random.Random()
    try:
        version, internal, gauss_next = saved
        rng.setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError) as err:
        raise ValueError(f"state_dict['rng'] is not a saved RNG state ({err})") from err
    return rng


def _counters_from_state(state: Mapping[str, Any]) -> dict[str, int]:
    saved = _require(state, "counters")
    if not isinstance(saved, Mapping) or not all(_is_int(saved.get(name)) for name in _COUNTERS):
        raise ValueError(f"state_dict['counters'] must map each of {', '.join(_COUNTERS)} to an int, "
                         f"got {saved!r}")
    return {name: int(saved[name]) for name in _COUNTERS}
