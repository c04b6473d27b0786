"""The fleet engine's requests against a stand-in server (plain HTTP, no vLLM): greedy decoding sends its prompts at once,
and both engines' requests carry the same sampling fields."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.fleet.engine import GENERATE_ROUTE, VLLMServerEngine
from ggpo_lightning.rollouts.vllm.sampling import sampling_params

EOS = 2
REPLY_SECONDS = 0.3


class StandIn(BaseHTTPRequestHandler):
    """Answers the RL routes with ``{}`` and each generate request, after :data:`REPLY_SECONDS`, with the prompt's
    last token; records the sampling fields and the most requests it held at once."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"null")
        reply = {}
        if self.path == GENERATE_ROUTE:
            state = self.server.state
            with state["lock"]:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                state["params"].append(body["sampling_params"])
            time.sleep(REPLY_SECONDS)
            with state["lock"]:
                state["in_flight"] -= 1
            reply = {"choices": [{"index": 0, "token_ids": [body["token_ids"][-1], EOS],
                                  "weight_versions": [{"version": "3"}]}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class NoTransfer:
    """vLLM's trainer-side transfer engine, standing in: a push sends nothing."""

    source = None

    def send_weights(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


@pytest.fixture()
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.state = {"lock": threading.Lock(), "in_flight": 0, "most": 0, "params": []}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def tokenizer() -> SimpleNamespace:
    return SimpleNamespace(eos_token_id=EOS, batch_decode=lambda ids, skip_special_tokens: [str(i) for i in ids])


def pushed_engine(url: str) -> VLLMServerEngine:
    engine = VLLMServerEngine([url], tokenizer(), dtype=None, record_logprobs=False, request_timeout=30,
                              server_timeout=30, transfer_init=lambda url: NoTransfer())
    engine.load_weights([], version=3)
    return engine


def test_greedy_sends_its_prompts_at_once_and_keeps_their_order(stand_in):
    engine = pushed_engine(f"http://127.0.0.1:{stand_in.server_address[1]}")
    prompts = [[10 + i] for i in range(8)]
    try:
        generations = engine.greedy(prompts, 4)
    finally:
        engine.close()
    assert [g.response_ids for g in generations] == [[[p[0], EOS]] for p in prompts]
    assert [g.versions for g in generations] == [[[3, 3]]] * 8
    assert stand_in.state["most"] > 1, "greedy sent one request at a time"  # each is held REPLY_SECONDS
    assert all(p["temperature"] == 0.0 and p["n"] == 1 and p["max_tokens"] == 4 for p in stand_in.state["params"])


def test_a_sampled_request_carries_the_fields_the_in_process_engine_gives_vllm(stand_in):
    engine = pushed_engine(f"http://127.0.0.1:{stand_in.server_address[1]}")
    try:
        engine.generate([[5]], 3, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=6))
    finally:
        engine.close()
    (sent,) = stand_in.state["params"]
    assert sent == sampling_params(3, 0.7, 0.9, 6, sent["seed"], eos=EOS, record_logprobs=False)
    assert isinstance(sent["seed"], int) and sent["stop_token_ids"] == [EOS] and sent["logprobs"] is None
