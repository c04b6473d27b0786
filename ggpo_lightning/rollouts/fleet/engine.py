"""Generation on vLLM servers (``model.rollout.engine: vllm_server``): one or many ``vllm serve`` processes, on this
host or any other, with weights pushed through vLLM's own weight-transfer API.

:class:`VLLMServerEngine` implements :class:`~ggpo_lightning.rollouts.protocol.RolloutEngine` over HTTP:

- **Requests.** One request per prompt to vLLM's token-in-token-out route ``/inference/v1/generate`` (``vllm serve
  --enable-scale-out``): token ids in and out (no re-tokenization), ``n = K``, a seed per request drawn from torch's
  global RNG (seeded per run and rank), the sampled tokens' raw log-probs (``--logprobs-mode raw_logprobs``: the
  log-softmax at temperature 1 before top-p, the quantity the other engines record) unless
  ``model.rollout.server_logprobs: false``; the fields are the in-process engine's
  (:mod:`~ggpo_lightning.rollouts.vllm.sampling`). Up to :data:`REQUEST_THREADS` requests are in flight at once,
  ``greedy``'s (temperature 0) as ``generate``'s. Each request goes to the serving server with the least work
  outstanding (requests in flight). A request a server refuses as malformed (HTTP 400/422) is the run's error
  (:class:`RequestRejected`), raised at once.
- **Versions.** The server labels every response's tokens with the weight versions that sampled them (vLLM's
  weight-version spans): each response carries ``[first, last]`` (:attr:`Generation.versions`). ``first < last``
  when a push landed while it was generated (``model.rollout.in_flight_updates: keep``).
- **Weights** (:meth:`load_weights`): to every live server at once, each paused only around its own transfer:
  ``/pause`` (``keep``: requests in flight stay and go on with the new weights; ``wait``: they finish first, with
  the old ones), vLLM's trainer-side engine (``WeightTransferTrainerFactory``: start, update while broadcasting,
  finish; backend ``nccl`` on GPUs, the package's ``ggpo_gloo`` elsewhere, in packed buckets), ``/update_weight_version``,
  ``/resume``. The transfers share one pass over the learner's weights
  (:class:`~ggpo_lightning.rollouts.fleet.push.StreamedWeights`: each tensor gathered and cast to the serving dtype
  only as it is sent; :func:`~ggpo_lightning.rollouts.fleet.push.send_together`). Names are the Hugging Face
  model's. With several trainer ranks rank 0 pushes and the others take part in the pass's gathers (a sharded
  learner's) without keeping what they gather; then every rank learns from rank 0 which servers hold the push (the
  others are out on every rank) and which adapter requests name, or the error that ended the push, raised on every
  rank (:class:`PushOutcome`).
- **Faults.** A request that fails by its server's fault (no answer within ``request_timeout``, an HTTP error, an abort
  the server made itself, weights never pushed) takes its server out (named once in the log) and is sent to another,
  up to :data:`REQUEST_ATTEMPTS` server faults; then, as for a reply that cannot be read, :class:`RequestFailed`
  names the request (the run's error: a poison request must not take out the fleet). Each server has an epoch that
  grows each time it is taken out: a reply to a request sent in an earlier epoch is discarded and the request sent
  again. A push that fails takes its server out without ``/resume`` (its model may be half loaded), and aborts the
  requests it holds (``/abort_requests``) so that they are sent elsewhere at once. A request failure never shuts
  down a transfer: only the pushing thread drops it. A server out is probed at every push; once it answers it is put
  back, and it is used again only after it received the whole of a push (its version restarted with it). A local
  server (``servers: local``) whose process ended is started again at the next push (up to ``MAX_RESTARTS`` times,
  :mod:`~ggpo_lightning.rollouts.fleet.launcher`), and re-synced once it answers. Local servers die with the trainer,
  however it dies (:mod:`~ggpo_lightning.rollouts.fleet.reaper`). Requests
  with no usable server wait on the engine's condition, which a push or a re-sync wakes. Each server's state and
  its transitions: :mod:`~ggpo_lightning.rollouts.fleet.server_state`. With no server usable for ``server_timeout``
  seconds, :class:`ServersUnavailable` names each URL and its last error (the run then aborts with
  ``aborted.ckpt``, and resumes from it once servers are back).
- **Resume.** The servers' weights are never saved; a resume pushes the learner's (exact when the checkpoint was
  taken at a sync, :class:`~ggpo_lightning.rollouts.protocol.SyncedOnResume`). A run pushes the learner's weights
  before its first rollout (:attr:`VLLMServerEngine.sync_before_rollouts`), so servers started on another
  checkpoint never sample for it.
- **LoRA** (``lora_rank``): each publish writes the adapter into the run's ``adapters/v{version}`` folder and loads
  it on every server (``/v1/load_lora_adapter``; requests then name it, and their version is its version); the base
  is pushed only to a server that lacks it, and to all after a reference refresh merged an adapter into it (with
  ``/pause?mode=wait``; the old base's adapters are unloaded first). An adapter is unloaded only when no request in
  flight on that server names it. A 404 for an adapter being replaced is no server's fault: the request waits for
  the publish to end and names the new one; a 404 for the current adapter outside a publish means the server lost
  it (it restarted), and takes it out until re-synced. The servers read the folder: the same machine, or a shared
  filesystem.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ggpo_lightning.core.distributed import all_gather_objects, world
from ggpo_lightning.core.rank_agreement import from_rank0
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.records.errors import RunAborted
from ggpo_lightning.rollouts.fleet.push import StreamedWeights, send_together, transfer_engine
from ggpo_lightning.rollouts.fleet.server_state import FleetServer, ServerState
from ggpo_lightning.rollouts.protocol import AdapterWeights, Generation, Weights
from ggpo_lightning.rollouts.vllm.sampling import VLLMSampler

__all__ = ["RequestFailed", "RequestRejected", "ServerAnswered", "ServerCounts", "ServerReset", "ServersUnavailable",
           "VLLMServerEngine", "server_engine", "short_error"]

log = logging.getLogger(__name__)

GENERATE_ROUTE = "/inference/v1/generate"
REQUEST_THREADS = 64
"""Requests in flight at once (one prompt each); vLLM batches them on the servers."""
IN_FLIGHT_PAUSE = {"keep": "keep", "drain": "wait"}
"""``model.rollout.in_flight_updates`` -> vLLM's ``/pause`` mode around a push."""
REQUEST_ATTEMPTS = 3
"""Server faults one request may meet (each takes its server out) before it is the run's error
(:class:`RequestFailed`): a request that breaks every server it reaches must not take out the whole fleet."""
ABORT_TIMEOUT = 10.0
"""Seconds to ask a server whose push failed to abort its requests (it is likely dead: nothing to wait for)."""


@dataclass(frozen=True)
class PushOutcome:
    """What every trainer rank learns from rank 0 after a push (:meth:`VLLMServerEngine.load_weights`)."""

    serving: list[str]
    """The URLs of the servers that hold the push: the only ones any rank sends requests to."""
    adapter: tuple[str, int] | None
    """The LoRA adapter requests name, and its version (None: the base model)."""
    errors: dict[str, str]
    """Each server's last error, for the messages that name it."""


class ServersUnavailable(RunAborted):
    """No vLLM server could be used for ``server_timeout`` seconds."""


class RequestRejected(ValueError):
    """A server refused a request as malformed (HTTP 400/422, e.g. a prompt longer than its context): an error of the
    run, not of the server, raised at once."""


class RequestFailed(RunAborted):
    """A request failed on :data:`REQUEST_ATTEMPTS` servers in turn, or its reply could not be read: the run's error
    (it stops with ``aborted.ckpt``), one line naming the request (not "no server usable")."""


class ServerAnswered(RuntimeError):
    """A server answered a route with an HTTP error (``status``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _ServerFault(Exception):
    """A request failed by its server's fault (``error``): the server is taken out, the request sent elsewhere."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class ServerReset(RuntimeError):
    """A server's response came from weights the engine never pushed (it restarted unnoticed): taken out, the
    request sent elsewhere."""


@dataclass
class ServerCounts:
    """What the fleet did since the last :meth:`VLLMServerEngine.take_counts` (logged per step)."""

    retries: int = 0
    """Requests sent again after their server failed."""
    resyncs: int = 0
    """Servers that came back and received the weights."""
    restarts: int = 0
    """Local servers (``servers: local``) started again after they crashed."""
    push_seconds: float = 0.0
    """Seconds of weight pushes (all servers)."""


class VLLMServerEngine(VLLMSampler):
    """Samples on vLLM servers at ``urls`` (see the module docstring).

    Args:
        urls: the servers' base URLs (``http://host:port``).
        tokenizer: the learner's tokenizer (responses are decoded with it; its EOS stops them).
        dtype: the serving dtype: the tensors of a push are cast to it.
        record_logprobs: ask for the sampled tokens' log-probs.
        request_timeout: seconds a request may take before its server is taken out.
        server_timeout: seconds without any usable server before :class:`ServersUnavailable`.
        in_flight_updates: ``keep`` or ``drain`` (``/pause`` mode around a push).
        fleet: local servers to start at :meth:`start` and stop at :meth:`close` (``servers: local:N``); their URLs
            are then the engine's, and the ones that crashed are started again at each push (``fleet.revive()``).
        lora_rank: a LoRA run's adapter rank: publish adapters (:attr:`publishes_adapters`); the servers must take
            runtime adapters of that rank (``ggpo serve --lora-rank``).
        transfer_init: makes vLLM's trainer-side transfer engine for one server (tests may replace it).
        bucket_bytes: bytes of one packed bucket of a ``ggpo_gloo`` push (0: one tensor at a time; None: the
            backend's default, 128 MiB).
        concurrent_push: push every server in one pass (False: one server after the other, each with a pass of its
            own, a comparison for benchmarks; a sharded learner is always pushed in one pass, its other ranks take
            part in one).

    With several trainer processes (``torch.distributed`` initialised) rank 0 pushes and every rank follows its
    outcome (:meth:`load_weights`).
    """

    def __init__(self, urls: Sequence[str], tokenizer, dtype: torch.dtype, *, record_logprobs: bool = True, request_timeout: float = 600.0, server_timeout: float = 300.0,
                 in_flight_updates: str = "keep", fleet: Any = None, lora_rank: int | None = None,
                 transfer_init: Callable[[str], Any] | None = None, bucket_bytes: int | None = None,
                 concurrent_push: bool = True) -> None:
        import requests

        if not urls and fleet is None:
            raise ValueError("model.rollout.servers lists no server")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs an eos token: responses stop at it")
        self.servers = [FleetServer(url.rstrip("/")) for url in urls]
        self.fleet = fleet
        self.tokenizer, self.dtype = tokenizer, dtype
        self.record_logprobs = record_logprobs
        self.request_timeout, self.server_timeout = request_timeout, server_timeout
        self.pause_mode = IN_FLIGHT_PAUSE[in_flight_updates]
        self.transfer_init = transfer_init or (lambda url: transfer_engine(url, self.request_timeout, bucket_bytes))
        self.concurrent_push = concurrent_push
        self.version = 0
        self.sync_before_rollouts = True
        """Samples only with weights this run pushed: the run pushes the learner's before its first rollout."""
        self.loads_while_generating = True
        """A push pauses the servers itself: the async producer need not stop for it (``in_flight_updates``)."""
        self.publishes_adapters = lora_rank is not None
        """A LoRA run: the servers get the adapter at each publish (:class:`AdapterWeights`), the base only when it
        changed."""
        self.adapter_dir: Path | None = None
        """Where published adapters are written (the run's ``adapters`` folder, set at :meth:`start`); the servers
        read them from there: the same machine, or a shared filesystem."""
        self._adapter: tuple[str, int] | None = None  # the adapter requests name, and its version
        self._publishing = False  # an adapter is being published: a 404 for the current one is no server fault
        self._base_revision: int | None = None  # of the base the servers hold (AdapterWeights.base_revision)
        self.counts = ServerCounts()
        self._wire_dtype: torch.dtype | None = None  # what the servers serve, asked at the first push
        self._lock = threading.Condition()
        self._http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=REQUEST_THREADS)  # a connection per request thread
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ the protocol

    def to(self, device: torch.device | str) -> VLLMServerEngine:
        """A no-op: the servers hold their own devices."""
        return self

    def unshare(self) -> None:
        """Never shares the learner's tensors: nothing to do."""

    def start(self, run_dir: Path) -> None:
        """Start the local servers (``servers: local:N``; their logs in ``run_dir/servers``); nothing for servers
        given by URL. A LoRA run's adapters are written under ``run_dir/adapters``. Idempotent."""
        self.adapter_dir = Path(run_dir) / "adapters"
        if self.fleet is None or self.servers:
            return
        rank, processes = world()
        urls = None
        if rank == 0:  # one fleet on the first process's machine, shared by every rank
            self.fleet.log_dir = Path(run_dir) / "servers"
            self.fleet.start()
            urls = self.fleet.urls
        else:
            self.fleet = None  # rank 0's to stop
        if processes > 1:
            urls = all_gather_objects(urls)[0]
        self.servers = [FleetServer(url) for url in urls]

    def close(self) -> None:
        """Stop the request threads, release the transfer groups and stop the local servers (servers given by URL
        keep running). Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for server in self.servers:
            self._drop_transfer(server)
        if self.fleet is not None:
            self.fleet.stop()

    def take_metrics(self) -> dict[str, float]:
        """``servers_alive`` (:attr:`alive`), and since the last call ``server_retries``, ``server_resyncs``,
        ``server_restarts`` and ``weight_push_seconds`` (a step's metrics)."""
        with self._lock:
            counts, self.counts = self.counts, ServerCounts()
        return {"servers_alive": float(self.alive), "server_retries": float(counts.retries),
                "server_resyncs": float(counts.resyncs), "server_restarts": float(counts.restarts),
                "weight_push_seconds": counts.push_seconds}

    @property
    def alive(self) -> int:
        """Servers in the fleet: answering, and not taken out since their last push (one in the middle of a push
        counts)."""
        return sum(s.in_fleet for s in self.servers)

    def load_weights(self, learner: Weights, version: int) -> None:
        """Push the learner's weights, tagged ``version``, to every server that answers (see the module docstring).
        On several trainer processes every rank takes part in the gathers, rank 0 pushes, and every rank learns from
        rank 0 which servers took the push and which adapter requests name (:class:`PushOutcome`), or rank 0's
        error, raised on every rank (:func:`~ggpo_lightning.core.rank_agreement.from_rank0`).

        Raises:
            ServersUnavailable: no server took them for ``server_timeout`` seconds (on every rank).
        """
        start = time.perf_counter()
        if isinstance(learner, AdapterWeights):
            push = functools.partial(self._publish_adapter, learner, version)
        else:
            source = self._source(learner)
            push = functools.partial(self._push_all, source, version)
            if world()[0] != 0:  # rank 0's pass gathers a sharded learner: a collective of every rank
                source.take_part_in_gathers()
        outcome = from_rank0(lambda: self._pushed_by_rank0(push))
        with self._lock:
            self.version = version
            self._adapter = outcome.adapter
            if world()[0] != 0:
                for server in self.servers:
                    server.follow_rank0(server.url in outcome.serving, outcome.errors.get(server.url))
            self._lock.notify_all()  # requests waiting for a usable server
            self.counts.push_seconds += time.perf_counter() - start

    def _pushed_by_rank0(self, push: Callable[[], None]) -> list[PushOutcome]:
        """Rank 0: ``push``, then its outcome for every rank."""
        push()
        with self._lock:
            outcome = PushOutcome([s.url for s in self.servers if s.usable], self._adapter,
                                  {s.url: s.last_error for s in self.servers if s.last_error})
        return [outcome] * world()[1]

    def _complete(self, prompt_ids: list[list[int]], params: list[dict[str, Any]]) -> list[Generation]:
        """The requests sent at once (up to :data:`REQUEST_THREADS` in flight), spread over the servers."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="ggpo-vllm-request")
        futures = [self._pool.submit(self._generate_one, list(prompt), fields)
                   for prompt, fields in zip(prompt_ids, params)]
        return [future.result() for future in futures]

    # ------------------------------------------------------------------ requests

    def _generate_one(self, prompt: list[int], params: dict[str, Any]) -> Generation:
        """One prompt's request, sent again (on the least busy server then) until a server answers it; up to
        :data:`REQUEST_ATTEMPTS` server faults, then :class:`RequestFailed`."""
        faults: list[str] = []
        while True:
            server, epoch, adapter = self._take_server()
            generation = None
            try:
                generation = self._attempt(server, epoch, prompt, params, adapter)
            except _ServerFault as fault:
                self._fail(server, fault.error, epoch)
                faults.append(f"{server.url}: {short_error(fault.error)}")
                if len(faults) >= REQUEST_ATTEMPTS:
                    raise RequestFailed(f"a request ({_describe(prompt)}) failed on {len(faults)} servers in turn; "
                                        f"the run stops here rather than take out every server: "
                                        + "; ".join(faults)) from fault.error
            finally:
                self._release(server, adapter)
            if generation is not None:
                return generation
            with self._lock:
                self.counts.retries += 1

    def _attempt(self, server: FleetServer, epoch: int, prompt: list[int], params: dict[str, Any],
                 adapter: tuple[str, int] | None) -> Generation | None:
        """The request sent once to ``server`` (taken in ``epoch``): its generation, or None when it is to be sent
        again at no server's fault (the server was taken out after it was sent, or its adapter is being replaced).

        Raises:
            _ServerFault: the server's fault (no answer, an HTTP error, an abort it made itself, weights never pushed).
            RequestRejected: the request is malformed (every server would refuse it).
            RequestFailed: the reply cannot be read (a parse error is the run's, not the server's).
        """
        body = {"token_ids": prompt, "sampling_params": params, "output_mode": "tokens"}
        if adapter is not None:  # the request is the adapter's, start to end: its version is the adapter's
            body["model"] = adapter[0]
        try:
            reply = self._post(server, GENERATE_ROUTE, body, self.request_timeout)
        except RequestRejected:
            raise
        except ServerAnswered as error:
            if error.status == 404 and adapter is not None and self._adapter_replaced(adapter):
                return None
            raise _ServerFault(error) from error
        except Exception as error:  # noqa: BLE001 - no answer: the server's fault
            raise _ServerFault(error) from error
        with self._lock:
            if server.epoch != epoch:  # taken out meanwhile (e.g. its push failed): its weights are unknown
                return None
        try:
            if any(choice.get("finish_reason") == "abort" for choice in reply["choices"]):  # the engine aborts only
                raise _ServerFault(RuntimeError("the server aborted the request"))  # servers it took out before
            return self._read(prompt, reply, None if adapter is None else adapter[1])
        except ServerReset as error:
            raise _ServerFault(error) from error
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            raise RequestFailed(f"the reply of {server.url} to a request ({_describe(prompt)}) cannot be read: "
                                f"{short_error(error)}") from error

    def _adapter_replaced(self, adapter: tuple[str, int]) -> bool:
        """After a 404 for ``adapter``: True once it is replaced (waiting for a publish in progress to end, up to
        ``server_timeout``), False when it is still the one to name (the server lost it: it restarted)."""
        with self._lock:
            if not self._publishing and self._adapter == adapter:
                return False
            if not self._lock.wait_for(lambda: not self._publishing, timeout=self.server_timeout):
                raise ServersUnavailable(f"no adapter published within model.rollout.server_timeout="
                                         f"{self.server_timeout:g} s (requests name {adapter[0]}, which a server "
                                         "no longer holds)")
            return True

    def _read(self, prompt: list[int], reply: dict[str, Any], adapter_version: int | None) -> Generation:
        """A server's reply: each choice's token ids, (recorded) log-probs, and the versions that sampled it."""
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        responses = [list(c["token_ids"]) for c in choices]
        logprobs = None
        if self.record_logprobs:
            logprobs = [[float(t["logprob"]) for t in c["logprobs"]["content"]] for c in choices]
        versions = [_first_last(c.get("weight_versions"), self.version) if adapter_version is None
                    else [adapter_version, adapter_version] for c in choices]
        return self._generation(prompt, responses, logprobs, versions)

    def _take_server(self) -> tuple[FleetServer, int, tuple[str, int] | None]:
        """The usable server with the least work outstanding, counted as taken, with its epoch and the adapter the
        request names (counted as in use on it); waits on the engine's condition (a push or a re-sync makes a
        server usable) while none is usable, up to ``server_timeout``, then :class:`ServersUnavailable`."""
        deadline = time.monotonic() + self.server_timeout
        with self._lock:
            while True:
                usable = [s for s in self.servers if s.usable]
                if usable:
                    server = min(usable, key=lambda s: s.outstanding)
                    server.outstanding += 1
                    adapter = self._adapter
                    if adapter is not None:
                        server.adapter_uses[adapter[0]] += 1
                    return server, server.epoch, adapter
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._unavailable()
                self._lock.wait(left)

    def _release(self, server: FleetServer, adapter: tuple[str, int] | None) -> None:
        """A request taken with :meth:`_take_server` has ended."""
        with self._lock:
            server.outstanding -= 1
            if adapter is not None:
                server.adapter_uses[adapter[0]] -= 1
            self._lock.notify_all()

    def _post(self, server: FleetServer, route: str, body: dict[str, Any] | None, timeout: float,
              params: dict[str, str] | None = None) -> Any:
        response = self._http.post(server.url + route, json=body, params=params, timeout=timeout)
        if response.status_code in (400, 422):  # the request itself is wrong: every server would refuse it
            raise RequestRejected(f"vLLM server {server.url} refused {route} ({response.status_code}): "
                                  f"{response.text[:300]}")
        if response.status_code != 200:
            raise ServerAnswered(response.status_code, f"{route} answered {response.status_code}: "
                                                       f"{response.text[:200]}")
        if "json" not in response.headers.get("content-type", ""):
            return response.text  # the LoRA routes answer in plain text
        return response.json()

    def _fail(self, server: FleetServer, error: BaseException, epoch: int | None = None) -> None:
        """Take ``server`` out (logged once per failure). ``epoch``: the one a failed request was sent in; a server
        taken out since then is left as it is. Its transfer is left alone: a push may be using it (the pushing
        thread drops it)."""
        with self._lock:
            if epoch is not None and server.epoch != epoch:
                return
            if server.failed(short_error(error)):  # once per failure: a server that answers again may fail its re-sync too
                log.warning("vLLM server %s failed and is taken out until it answers again and is re-synced: %s",
                            server.url, short_error(error))

    def _probe(self) -> None:
        """Start again the local servers that crashed (``servers: local``), and put back the servers that answer
        ``/health`` again (used once re-synced)."""
        if self.fleet is not None:
            restarted = len(self.fleet.revive())
            with self._lock:
                self.counts.restarts += restarted
        for server in self.servers:
            if server.answering:
                continue
            try:
                ok = self._http.get(server.url + "/health", timeout=5).status_code == 200
            except Exception as error:  # noqa: BLE001 - still out
                server.last_error = short_error(error)
                continue
            if ok:
                with self._lock:
                    server.answers_again()
                log.warning("vLLM server %s answers again; it is used after its next weight push", server.url)

    def _unavailable(self) -> ServersUnavailable:
        lines = "; ".join(f"{s.url}: {s.last_error or ('not re-synced yet' if s.answering else 'out')}"
                          for s in self.servers)
        return ServersUnavailable(f"no vLLM server usable for model.rollout.server_timeout={self.server_timeout:g} s "
                                  f"({lines})")

    # ------------------------------------------------------------------ weights

    def _source(self, weights: Weights) -> StreamedWeights:
        """The weights as pushed: in the serving dtype, or in the servers' own when it is narrower (servers that
        serve bf16 would cast float32 on arrival: the same numbers, twice the bytes on the wire)."""
        if self._wire_dtype is None:
            self._wire_dtype = self._servers_dtype()
        dtype = self.dtype
        if self._wire_dtype is not None and dtype is not None and self._wire_dtype.itemsize < dtype.itemsize:
            dtype = self._wire_dtype
        return StreamedWeights.of(weights, dtype)

    def _servers_dtype(self) -> torch.dtype | None:
        """The dtype the first server that answers serves (``/server_info``); None when none answers yet (asked
        again at the next push)."""
        for server in self.servers:
            try:
                reply = self._http.get(server.url + "/server_info", params={"config_format": "json"}, timeout=10)
                name = str(reply.json()["vllm_config"]["model_config"]["dtype"]).removeprefix("torch.")
            except Exception:  # noqa: BLE001 - not answering (yet): the probes and the push deal with it
                continue
            dtype = getattr(torch, name, None)
            return dtype if isinstance(dtype, torch.dtype) else None
        return None

    def _publish_adapter(self, weights: AdapterWeights, version: int) -> None:
        """The adapter to every server, loaded under the name ``v{version}``, after the base where a server lacks it:
        a new or re-synced server, or every server once a refresh merged an adapter into the base (pushed with
        ``/pause?mode=wait``: the requests in flight run an adapter of the old base, and finish first). Requests name
        the new adapter once every server was offered it; until then a 404 for the old one is no server's fault (the
        request waits for the publish to end). An adapter is unloaded only when no request in flight names it."""
        if self.adapter_dir is None:
            raise RuntimeError("the engine publishes adapters into the run's folder: call start(run_dir) first")
        base: list[StreamedWeights] = []  # made once, when a server needs it

        def base_source() -> StreamedWeights:
            if not base:
                base.append(self._source(weights.base()))
            return base[0]

        if weights.base_revision != self._base_revision:
            with self._lock:
                for server in self.servers:
                    server.weights_changed()
            self._base_revision = weights.base_revision
        name, folder = f"v{version}", self.adapter_dir / f"v{version}"
        weights.save(folder)
        with self._lock:
            self._publishing = True
        published = False
        try:
            self._to_every_server(lambda servers: [self._publish(s, base_source, name, folder, version)
                                                   for s in servers])
            published = True
        finally:
            with self._lock:
                if published:
                    self._adapter = (name, version)
                self._publishing = False
                self._lock.notify_all()  # requests waiting for the publish to end

    def _publish(self, server: FleetServer, base: Callable[[], StreamedWeights], name: str, folder: Path,
                 version: int) -> None:
        try:
            if not server.usable:  # new, back, or its base changed: the base first, without the old adapters
                self._unload(server, list(server.adapters), drain=True)
                self._push(server, base(), version, pause_mode="wait", raise_error=True)
            self._post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)},
                       self.request_timeout)
            server.adapters.append(name)
            current = None if self._adapter is None else self._adapter[0]  # requests name it until the publish ends
            self._unload(server, [old for old in server.adapters if old not in (name, current)])
        except RequestRejected:  # the adapter itself (its rank, its files): every server would refuse it
            raise
        except Exception as error:  # noqa: BLE001 - taken out until it answers and takes a push
            self._fail(server, error)

    def _unload(self, server: FleetServer, names: list[str], drain: bool = False) -> None:
        """Unload the adapters ``names`` from ``server``: each one no request in flight names (the others stay loaded
        until a later publish), or with ``drain`` every one, once its requests ended (up to ``request_timeout``:
        by then they have timed out)."""
        for name in names:
            with self._lock:
                if drain:
                    self._lock.wait_for(lambda: not server.adapter_uses[name], timeout=self.request_timeout)
                elif server.adapter_uses[name]:
                    continue
            try:
                self._post(server, "/v1/unload_lora_adapter", {"lora_name": name}, self.request_timeout)
            except ServerAnswered as error:
                if error.status != 404:
                    raise
                # 404: the server no longer holds it (it restarted): nothing to unload
            server.adapters.remove(name)

    def _push_all(self, source: StreamedWeights, version: int) -> None:
        """``source`` to every server that answers, in one pass (:meth:`_push_together`); while none took it, again
        to those that answer, unless the source is sharded (the other ranks took part in one pass: the servers that
        missed it are re-synced at the next push)."""
        passes = 0

        def push(servers: list[FleetServer]) -> None:
            nonlocal passes
            if passes and source.collective:
                raise self._unavailable()
            passes += 1
            if self.concurrent_push or source.collective:
                self._push_together(servers, source, version)
            else:
                for server in servers:
                    self._push(server, source, version)

        try:
            self._to_every_server(push)
        finally:
            if not passes:  # the other ranks wait in the gathers of a pass
                source.take_part_in_gathers()
        self._base_revision = 0 if self._base_revision is None else self._base_revision

    def _push_together(self, servers: list[FleetServer], source: StreamedWeights, version: int) -> None:
        """Each server's push (:meth:`_push`) in a thread of its own, their transfers joined into one pass once each
        server is paused (or out)."""
        if len(servers) == 1:
            self._push(servers[0], source, version)
            return
        together = _Together(len(servers), lambda transfers: send_together(transfers, source, self.request_timeout),
                             source, self.request_timeout)

        def push(server: FleetServer) -> None:
            try:
                self._push(server, source, version, send=lambda s, _: together.send(s, self._transfer(s)))
            finally:
                together.leave(server)

        with ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="ggpo-push") as pool:
            list(pool.map(push, servers))

    def _to_every_server(self, push: Callable[[list[FleetServer]], None]) -> None:
        """``push`` to the servers that answer (each failure takes its server out), until at least one holds the
        weights; probing the others every 2 s up to ``server_timeout``, then :class:`ServersUnavailable`."""
        self._probe()
        deadline = time.monotonic() + self.server_timeout
        while True:
            answering = [s for s in self.servers if s.answering]
            if answering:
                push(answering)
            if any(s.usable for s in self.servers):
                return
            if time.monotonic() > deadline:
                raise self._unavailable()
            time.sleep(2.0)
            self._probe()

    def _push(self, server: FleetServer, source: StreamedWeights, version: int, pause_mode: str | None = None,
              raise_error: bool = False, send: Callable[[FleetServer, StreamedWeights], None] | None = None) -> None:
        """``source`` to ``server`` (``send``: its transfer; by default on its own, :meth:`_send`): paused, sent,
        tagged, resumed. A push that fails leaves the server paused and out (its requests aborted, their replies
        discarded) until a later push to it succeeds: a half-loaded model never samples."""
        with self._lock:
            stale = server.state is ServerState.BACK  # failed since its last push: its transfer group is gone
            server.begin_push()  # no request goes to it while its weights change
        if stale:
            self._drop_transfer(server)
        try:
            self._post(server, "/pause", None, self.request_timeout, params={"mode": pause_mode or self.pause_mode})
            (send or self._send)(server, source)
            self._post(server, "/update_weight_version", {"new_version": str(version)}, self.request_timeout)
        except Exception as error:  # noqa: BLE001 - taken out until it answers and takes a push
            self._fail(server, error)  # first: the replies of its aborted requests are then discarded
            self._drop_transfer(server)
            self._abort_requests(server)
            if raise_error or isinstance(error, RequestRejected):
                raise
            return
        try:
            self._post(server, "/resume", None, self.request_timeout)
        except Exception as error:  # noqa: BLE001 - its weights are whole, but it no longer answers
            self._fail(server, error)
            return
        with self._lock:
            if server.pushed():
                self.counts.resyncs += 1
            self._lock.notify_all()  # requests waiting for a usable server

    def _abort_requests(self, server: FleetServer) -> None:
        """Ask a server whose push failed to abort every request it holds (kept paused otherwise), so that they are
        sent elsewhere at once; a server that does not answer has none left to abort."""
        try:
            self._post(server, "/abort_requests", {}, ABORT_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - dead, or dying: its requests fail on their own
            log.debug("vLLM server %s did not abort its requests: %s", server.url, short_error(error))

    def _send(self, server: FleetServer, source: StreamedWeights) -> None:
        transfer = self._transfer(server)
        transfer.source = source  # vLLM's full-resync engines replay their source at each send
        transfer.send_weights()

    def _transfer(self, server: FleetServer) -> Any:
        """The server's transfer engine, made at its first push (the rendezvous)."""
        if server.transfer is None:
            server.transfer = self.transfer_init(server.url)
        return server.transfer

    def _drop_transfer(self, server: FleetServer) -> None:
        transfer, server.transfer = server.transfer, None
        if transfer is not None:
            transfer.shutdown()


class _Together:
    """The transfers of one push to several servers, joined into one pass: each server's thread hands in its
    transfer engine (:meth:`send`) or drops out (:meth:`leave`, a failed pause); the last to arrive runs the pass
    (``run``, over the transfers handed in: possibly none, then a sharded source is still passed through for the
    other ranks' gathers), and each :meth:`send` returns, or raises its own transfer's error."""

    def __init__(self, expected: int, run: Callable[[list[Any]], list[BaseException | None]],
                 source: StreamedWeights, timeout: float) -> None:
        self.expected, self.run, self.source, self.timeout = expected, run, source, timeout
        self.arrived: set[str] = set()
        self.joined: dict[str, Any] = {}
        self.errors: dict[str, BaseException | None] | None = None
        self.started = False  # every server arrived: the pass runs (a transfer failing in it must not be shut down)
        self.cond = threading.Condition()

    def send(self, server: FleetServer, transfer: Any) -> None:
        with self.cond:
            self.joined[server.url] = transfer
        self._arrive(server)
        with self.cond:
            if not self.cond.wait_for(lambda: self.started, self.timeout):
                raise TimeoutError(f"the push to {server.url} waited {self.timeout:g} s for the other servers")
            self.cond.wait_for(lambda: self.errors is not None)  # the pass is bounded by its transfers' timeouts
            error = self.errors[server.url]
        if error is not None:
            raise error

    def leave(self, server: FleetServer) -> None:
        self._arrive(server)

    def _arrive(self, server: FleetServer) -> None:
        with self.cond:
            if server.url in self.arrived:
                return
            self.arrived.add(server.url)
            if len(self.arrived) < self.expected:
                return
            joined = dict(self.joined)
            self.started = True
        errors: dict[str, BaseException | None] = {}
        try:
            if joined:
                errors = dict(zip(joined, self.run(list(joined.values()))))
            else:
                self.source.take_part_in_gathers()
        except BaseException as error:  # noqa: BLE001 - the pass itself failed: every server's push fails with it
            errors = {url: error for url in joined}
        with self.cond:
            self.errors = errors
            self.cond.notify_all()


def server_engine(tokenizer, config: RolloutConfig, model_name_or_path: str, dtype: torch.dtype, *,
                  record_logprobs: bool, in_flight_updates: str, lora_rank: int | None = None) -> VLLMServerEngine:
    """The engine of ``model.rollout.engine: vllm_server``: the servers at ``servers``, or ``local:N`` servers of
    ``model_name_or_path`` started at :meth:`VLLMServerEngine.start` (on ``server_devices`` when set)."""
    fleet = None
    if config.local_servers is not None:
        from ggpo_lightning.rollouts.fleet.launcher import LocalFleet, split_devices, vllm_flags

        devices = None if config.server_devices is None else split_devices(config.server_devices, config.local_servers)
        fleet = LocalFleet(model_name_or_path, config.local_servers, log_dir=None, dtype=str(dtype).removeprefix("torch."),
                           devices=devices, extra_args=vllm_flags(config.vllm_args), max_lora_rank=lora_rank)
    return VLLMServerEngine([] if fleet else list(config.servers), tokenizer, dtype, record_logprobs=record_logprobs, request_timeout=config.request_timeout,
                            server_timeout=config.server_timeout, in_flight_updates=in_flight_updates, fleet=fleet,
                            lora_rank=lora_rank, bucket_bytes=config.push_bucket_mib << 20)


def _first_last(spans: list[dict[str, Any]] | None, default: int) -> list[int]:
    """``[first, last]`` version of a response's weight-version spans (``default`` when the server gave none).

    Raises:
        ServerReset: a span is not one of the engine's versions (vLLM's ``"default"``: the server restarted since
            its last push, with the folder's weights).
    """
    if not spans:
        return [default, default]
    labels = [str(span["version"]) for span in spans]
    if not all(label.isdigit() for label in labels):
        raise ServerReset(f"the server answered with weights of version {labels[0]!r}, not a pushed one: it "
                          "restarted since the last push")
    return [int(labels[0]), int(labels[-1])]


def _describe(prompt: list[int]) -> str:
    """A request named in an error: its prompt's length and first token ids."""
    head = ", ".join(str(t) for t in prompt[:8])
    return f"prompt of {len(prompt)} tokens [{head}{', ...' if len(prompt) > 8 else ''}]"


def short_error(error: BaseException) -> str:
    """``error`` in one line of at most ~200 characters, with its type."""
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
