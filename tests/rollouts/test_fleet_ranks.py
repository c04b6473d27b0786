"""The fleet engine on two trainer ranks (two real gloo processes) against stand-in servers: every rank follows rank
0's push, whatever it saw itself. A server rank 0's push did not reach is out on every rank; every rank's requests
name the adapter rank 0 published; a push that found no server raises on both ranks with the same one line, within
``server_timeout`` (the gloo group's timeout fails a rank left waiting)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from gloo_ranks import on_two_ranks
from ggpo_lightning.records.errors import RunAborted
from ggpo_lightning.rollouts.fleet.engine import VLLMServerEngine
from ggpo_lightning.rollouts.protocol import AdapterWeights
from stand_in_vllm import StandInTransfer, StandInVLLM

EOS = 2
SERVER_TIMEOUT = 3.0


def _engine(urls: list[str], lora: bool = False) -> VLLMServerEngine:
    tokenizer = SimpleNamespace(eos_token_id=EOS, batch_decode=lambda ids, skip_special_tokens: [str(i) for i in ids])
    return VLLMServerEngine(urls, tokenizer, dtype=torch.float32, record_logprobs=False, request_timeout=5,
                            server_timeout=SERVER_TIMEOUT, transfer_init=StandInTransfer,
                            lora_rank=8 if lora else None)


def _push_then_generate(urls: list[str], rank: int) -> dict:
    """Push (server 1 dies in it, on rank 0's transfer), then greedy-decode one prompt per rank (10 + rank)."""
    engine = _engine(urls)
    try:
        engine.load_weights({"w": torch.ones(2)}, version=1)
        states = [s.state.value for s in engine.servers]
        generations = engine.greedy([[10 + rank]], 2)
        return {"states": states, "responses": generations[0].response_ids, "version": engine.version}
    finally:
        engine.close()


def _publish_adapter(urls: list[str], run_dir: str, rank: int) -> dict:
    engine = _engine(urls, lora=True)
    engine.start(Path(run_dir) / f"rank{rank}")
    adapter = AdapterWeights(base=lambda: {"w": torch.ones(2)},
                             save=lambda folder: folder.mkdir(parents=True, exist_ok=True), base_revision=0)
    try:
        engine.load_weights(adapter, version=1)
        engine.greedy([[10 + rank]], 2)
        return {"adapter": engine._adapter}
    finally:
        engine.close()


def _push_into_nothing(urls: list[str], rank: int) -> dict:
    engine = _engine(urls)
    start = time.monotonic()
    try:
        engine.load_weights({"w": torch.ones(2)}, version=1)
        return {"error": None}
    except RunAborted as stop:
        return {"error": (type(stop).__name__, str(stop)), "seconds": time.monotonic() - start}
    finally:
        engine.close()


def _two_servers() -> list[StandInVLLM]:
    return [StandInVLLM(eos=EOS).start() for _ in range(2)]


def test_a_server_rank_0s_push_did_not_reach_is_out_on_every_rank():
    servers = _two_servers()
    servers[1].die_at("/update_weights")  # server 1 dies while rank 0 sends it the weights
    try:
        zero, one = on_two_ranks(functools.partial(_push_then_generate, [s.url for s in servers]))
    finally:
        for server in servers:
            server.stop()
    assert zero["states"] == one["states"] == ["serving", "out"]
    assert zero["version"] == one["version"] == 1
    assert zero["responses"] == [[10, EOS]] and one["responses"] == [[11, EOS]]
    # rank 1 sent nothing to the server rank 0 took out: both ranks' prompts went to server 0
    assert sorted(body["token_ids"] for body in servers[0].generate_bodies) == [[10], [11]]


def test_every_ranks_requests_name_the_adapter_rank_0_published(tmp_path):
    servers = _two_servers()
    try:
        zero, one = on_two_ranks(functools.partial(_publish_adapter, [s.url for s in servers], str(tmp_path)))
    finally:
        for server in servers:
            server.stop()
    assert zero["adapter"] == one["adapter"] == ("v1", 1)
    bodies = [body for server in servers for body in server.generate_bodies]
    assert sorted(body["token_ids"] for body in bodies) == [[10], [11]]
    assert all(body.get("model") == "v1" for body in bodies), bodies  # rank 1's too: it never loaded an adapter


def test_a_push_that_finds_no_server_stops_both_ranks_with_one_line():
    servers = _two_servers()
    for server in servers:
        server.kill()
    try:
        zero, one = on_two_ranks(functools.partial(_push_into_nothing, [s.url for s in servers]))
    finally:
        for server in servers:
            server.stop()
    assert zero["error"][0] == "ServersUnavailable" and one["error"][0] == "RunAborted"
    assert zero["error"][1] == one["error"][1] and all(s.url in one["error"][1] for s in servers)
    assert "server_timeout=3 s" in one["error"][1]
    assert zero["seconds"] < SERVER_TIMEOUT + 10 and one["seconds"] < SERVER_TIMEOUT + 10
