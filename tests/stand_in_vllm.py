"""A stand-in for a ``vllm serve`` process, for tests only (never shipped): plain HTTP on a thread of the test process,
answering the routes the fleet engine (:mod:`ggpo_lightning.rollouts.fleet`) uses, with the semantics of vLLM 0.32's
dev-mode server, and faults on demand. ``make test`` covers the fleet's fault handling with it, without vLLM.

Routes (vLLM's paths and reply shapes):

- ``POST /inference/v1/generate``: ``n`` choices, each the prompt's last token then :attr:`StandInVLLM.eos`, with
  log-probs when asked and the weight-version spans of the tokens (a push that lands while a request is held splits
  its span). A request naming an adapter that is not loaded gets vLLM's 404; one sent while paused waits for
  ``/resume``; an aborted one answers ``finish_reason: "abort"`` with the tokens so far (vLLM answers 200).
- ``/pause?mode=keep|wait|abort`` (``wait`` returns once the requests in flight finished; ``abort`` aborts them),
  ``/resume``, ``/is_paused``, ``/abort_requests`` (every request in flight when no ids are given).
- The weight-transfer routes (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update``, ``/shutdown_weight_transfer_engine``), driven by :class:`StandInTransfer`, the fake
  trainer-side engine the engine's ``transfer_init`` makes; ``/update_weight_version`` and ``/weight_info``
  (``"default"`` after a start, as vLLM).
- ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter`` (plain text, 404 for an unknown adapter), ``GET /health``.

Faults: :attr:`StandInVLLM.reply_seconds` and :meth:`StandInVLLM.slow` (slow replies), :meth:`StandInVLLM.fail_next`
(500s), :meth:`StandInVLLM.drop_next` (a connection closed without a reply), :meth:`StandInVLLM.answer_next` (a
reply of the test's own, e.g. malformed), :meth:`StandInVLLM.die_at` (the process dies when a route is called: e.g.
``/update_weights``, death mid-push), :meth:`StandInVLLM.kill` and :meth:`StandInVLLM.restart` (the same port,
weights ``"default"`` again), and :meth:`StandInVLLM.forget_adapter` (the next request naming it gets a 404).
:attr:`StandInVLLM.calls` records every route called, in order.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests

GENERATE_ROUTE = "/inference/v1/generate"
TRANSFER_ROUTES = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update",
                   "/shutdown_weight_transfer_engine")


class Died(Exception):
    """Raised inside a handler whose server was killed: its connection is dropped."""


class _Request:
    """A generate request the server holds: aborted by ``/abort_requests`` or ``/pause?mode=abort``."""

    def __init__(self) -> None:
        self.aborted = False


class StandInVLLM:
    """One stand-in server on ``127.0.0.1`` (a free port, kept across :meth:`restart`); :meth:`start` before use,
    :meth:`stop` after (the :func:`stand_in_vllm` fixture does both).

    Args:
        eos: the token every response ends with.
        reply_seconds: how long each generate request is held before its reply (requests in flight overlap).
    """

    def __init__(self, eos: int = 2, reply_seconds: float = 0.0) -> None:
        self.eos, self.reply_seconds = eos, reply_seconds
        self.port = 0
        self.lock = threading.Condition()
        self.calls: list[str] = []
        """Every route called, in order (the path without its query)."""
        self.generate_bodies: list[dict[str, Any]] = []
        self.pause_modes: list[str] = []
        self.pushed_names: list[list[str]] = []
        """The tensor names of each ``/update_weights``."""
        self.most_in_flight = 0
        self._failures: dict[str, list[int]] = {}
        self._drops: dict[str, int] = {}
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self._die_at: str | None = None
        self._slow: dict[str, float] = {}
        self._http: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self._reset()

    def _reset(self) -> None:
        """The state of a freshly started server."""
        self.version = "default"
        self.paused: str | None = None
        self.adapters: dict[str, str] = {}
        self.held: list[_Request] = []
        """Requests being generated (``pause(wait)`` waits for them)."""
        self.queued: list[_Request] = []
        """Requests that arrived while paused, waiting for ``/resume``."""
        self.dead = False

    # ------------------------------------------------------------------ life

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StandInVLLM:
        """Serve (on the port of a previous start, if any)."""
        handler = type("Handler", (_Handler,), {"stand_in": self})
        self._http = _Server(("127.0.0.1", self.port), handler)
        self.port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True, name=f"stand-in-vllm-{self.port}").start()
        return self

    def kill(self) -> None:
        """Die as a killed process: every connection closed (no reply to anything in flight), connections refused
        from now on."""
        with self.lock:
            self.dead = True
            self.lock.notify_all()
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed already
        if self._http is not None:
            http, self._http = self._http, None
            threading.Thread(target=lambda: (http.shutdown(), http.server_close())).start()

    def restart(self) -> None:
        """Come back on the same port as a new process: weights ``"default"``, no adapter, not paused."""
        self.kill()
        with self.lock:
            self._reset()
        deadline = time.monotonic() + 10
        while True:  # the killed server's socket may take a moment to close
            try:
                self.start()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop serving (the fixture's teardown)."""
        self.kill()

    # ------------------------------------------------------------------ faults

    def fail_next(self, route: str, times: int = 1, status: int = 500) -> None:
        """The next ``times`` calls of ``route`` answer ``status``."""
        with self.lock:
            self._failures.setdefault(route, []).extend([status] * times)

    def answer_next(self, route: str, reply: dict[str, Any]) -> None:
        """The next call of ``route`` answers 200 with ``reply`` (e.g. a malformed one)."""
        with self.lock:
            self._answers.setdefault(route, []).append(reply)

    def drop_next(self, route: str, times: int = 1) -> None:
        """The next ``times`` calls of ``route`` get their connection closed without a reply."""
        with self.lock:
            self._drops[route] = self._drops.get(route, 0) + times

    def slow(self, route: str, seconds: float) -> None:
        """Every call of ``route`` waits ``seconds`` before it is handled (generate: :attr:`reply_seconds`)."""
        self._slow[route] = seconds

    def die_at(self, route: str) -> None:
        """The next call of ``route`` kills the server (:meth:`kill`) before it answers."""
        self._die_at = route

    def forget_adapter(self, name: str) -> None:
        """Unload ``name`` behind the engine's back: requests naming it get a 404."""
        with self.lock:
            self.adapters.pop(name, None)

    # ------------------------------------------------------------------ routes

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        """``(status, reply)`` of one call (a dict is sent as JSON, a string as text)."""
        with self.lock:
            self.calls.append(path)
            self._wait(lambda: False, self._slow.get(path, 0.0))
            if self._die_at == path:
                self._die_at = None
                self.kill()
            if self.dead:
                raise Died
            failures = self._failures.get(path)
            if failures:
                return failures.pop(0), {"error": f"injected failure of {path}"}
            if self._drops.get(path):
                self._drops[path] -= 1
                raise Died
            if self._answers.get(path):
                return 200, self._answers[path].pop(0)
        if path == GENERATE_ROUTE:
            return self._generate(body)
        if path == "/pause":
            return self._pause(query.get("mode", "abort"))
        if path == "/abort_requests":
            return self._abort_all()
        with self.lock:
            return self._simple(method, path, body)

    def _simple(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """The routes that answer at once (called under the lock)."""
        if path == "/health":
            return 200, ""
        if path == "/resume":
            self.paused = None
            self.lock.notify_all()
            return 200, {"status": "resumed"}
        if path == "/is_paused":
            return 200, {"is_paused": self.paused is not None}
        if path == "/update_weight_version":
            self.version = str(body["new_version"])
            self.lock.notify_all()
            return 200, {"success": True, "new_version": self.version}
        if path == "/weight_info":
            return 200, {"weight_version": self.version}
        if path == "/update_weights":
            self.pushed_names.append(list(body["update_info"]["names"]))
        if path in TRANSFER_ROUTES:
            return 200, {"message": "ok"}
        if path == "/v1/load_lora_adapter":
            self.adapters[body["lora_name"]] = body["lora_path"]
            return 200, f"Success: LoRA adapter '{body['lora_name']}' added successfully."
        if path == "/v1/unload_lora_adapter":
            if self.adapters.pop(body["lora_name"], None) is None:
                return 404, _not_found(f"The lora adapter '{body['lora_name']}' cannot be found.")
            return 200, f"Success: LoRA adapter '{body['lora_name']}' removed successfully."
        return 404, {"detail": "Not Found"}

    def _generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        request = _Request()
        with self.lock:
            self.generate_bodies.append(body)
            model = body.get("model")
            if model is not None and model not in self.adapters:
                return 404, _not_found(f"The model `{model}` does not exist.")
            self.queued.append(request)  # vLLM's scheduler holds it while paused; an abort reaches it there too
            try:
                self._wait(lambda: self.paused is None or request.aborted)
            finally:
                self.queued.remove(request)
            first = self.version
            self.held.append(request)
            self.most_in_flight = max(self.most_in_flight, len(self.held))
            try:
                self._wait(lambda: request.aborted, self.reply_seconds)
                self._wait(lambda: self.paused != "keep" or request.aborted)  # frozen while paused (keep)
            finally:
                self.held.remove(request)
                self.lock.notify_all()
            last = self.version
        params = body["sampling_params"]
        tokens = [body["token_ids"][-1]] if request.aborted else [body["token_ids"][-1], self.eos]
        spans = [{"start": 0, "end": len(tokens), "version": first}] if first == last else [
            {"start": 0, "end": 1, "version": first}, {"start": 1, "end": len(tokens), "version": last}]
        logprobs = None if params.get("logprobs") is None else {"content": [{"logprob": -0.5} for _ in tokens]}
        choices = [{"index": i, "token_ids": tokens, "logprobs": logprobs, "weight_versions": spans,
                    "finish_reason": "abort" if request.aborted else "stop"} for i in range(params.get("n", 1))]
        return 200, {"choices": choices}

    def _pause(self, mode: str) -> tuple[int, Any]:
        with self.lock:
            self.pause_modes.append(mode)
            self.paused = mode
            if mode == "abort":
                self._abort_held()
            elif mode == "wait":
                self._wait(lambda: not self.held)
        return 200, {"status": "paused"}

    def _abort_all(self) -> tuple[int, Any]:
        with self.lock:
            count = self._abort_held()
        return 200, {"status": "aborted", "aborted": count}

    def _abort_held(self) -> int:
        for request in self.held + self.queued:
            request.aborted = True
        self.lock.notify_all()
        return len(self.held) + len(self.queued)

    def _wait(self, ready, seconds: float | None = None) -> None:
        """Wait (under the lock) until ``ready()`` or ``seconds`` passed (no bound: until ``ready()``, for a test's
        own time limit to catch); :class:`Died` when the server is killed meanwhile."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not ready():
            if self.dead:
                raise Died
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self.lock.wait(left if left is not None else 1.0)
        if self.dead:
            raise Died


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


def _not_found(message: str) -> dict[str, Any]:
    """vLLM's error body for a 404."""
    return {"error": {"message": message, "type": "NotFoundError", "param": None, "code": 404}}


class _Handler(BaseHTTPRequestHandler):
    stand_in: StandInVLLM
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn: a dropped connection is seen as such

    def setup(self) -> None:
        super().setup()
        with self.stand_in.lock:
            self.stand_in._connections.add(self.connection)

    def finish(self) -> None:
        with self.stand_in.lock:
            self.stand_in._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # the connection was cut by a kill

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._answer("POST")

    def _answer(self, method: str) -> None:
        url = urlparse(self.path)
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw) if raw else None
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            status, reply = self.stand_in.handle(method, url.path, query, body)
        except Died:
            self.close_connection = True
            self.connection.close()
            return
        data = (json.dumps(reply) if isinstance(reply, dict) else reply).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json" if isinstance(reply, dict) else "text/plain")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class StandInTransfer:
    """vLLM's trainer-side transfer engine, standing in (what ``VLLMServerEngine(transfer_init=...)`` makes): a push
    calls the server's weight-transfer routes as vLLM's HTTP client does (start, update with the tensors' names,
    finish) and sends no tensor. :attr:`shut_down_while_sending` records a shutdown that came in the middle of a
    push (what must never happen)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url, self.timeout = url, timeout
        self.source: Any = None
        self.sending = False
        self.shut_down_while_sending = False
        self._post("/init_weight_transfer_engine", {"init_info": {}})

    def send_weights(self, weight_version: str | None = None) -> None:
        self.sending = True
        try:
            self._post("/start_weight_update", None)
            self._post("/update_weights", {"update_info": {"names": [name for name, _ in self.source]}})
            self._post("/finish_weight_update", None if weight_version is None else {"weight_version": weight_version})
        finally:
            self.sending = False

    def shutdown(self) -> None:
        self.shut_down_while_sending |= self.sending
        try:
            self._post("/shutdown_weight_transfer_engine", None)
        except requests.RequestException:
            pass  # a dead server's group is gone with it, as vLLM's

    def _post(self, route: str, body: Any) -> None:
        requests.post(self.url + route, json=body, timeout=self.timeout).raise_for_status()


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, list]:
    """``call()`` on a thread of its own, started; the list receives its result, or the exception it raised."""
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as error:  # noqa: BLE001 - handed to the test
            out.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def until(condition: Callable[[], Any], seconds: float = 10.0) -> None:
    """Wait until ``condition()`` holds; an assertion error after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


@pytest.fixture()
def stand_in_vllm() -> Iterator[StandInVLLM]:
    """A started :class:`StandInVLLM`, stopped after the test."""
    server = StandInVLLM().start()
    yield server
    server.stop()
