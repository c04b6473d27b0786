"""A push's trainer side without vLLM: the streamed source (each tensor gathered and cast only as it is sent; the
ranks that do not push take part in the gathers and keep nothing), and one pass of it shared by every server of a
push, against stand-in servers that answer the pause and version routes."""

from __future__ import annotations

import functools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ggpo_lightning.rollouts.fleet.engine import VLLMServerEngine
from ggpo_lightning.rollouts.fleet.push import StreamedWeights


class Gathered(torch.Tensor):
    """A tensor that counts its ``full_tensor`` calls (FSDP's gather, standing in)."""

    calls = 0

    def full_tensor(self) -> torch.Tensor:
        Gathered.calls += 1
        return self.as_subclass(torch.Tensor) * 1  # a fresh tensor, as a gather makes


def sharded_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(4, 3, generator=generator).as_subclass(Gathered) for i in range(3)}


class Routes(BaseHTTPRequestHandler):
    """Answers every route with ``{}`` (``/pause`` with a 500 when the server's ``refuse_pause`` is set;
    ``/server_info`` with the dtype it ``serves``) and records the routes called but that one, in order."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.split("?")[0]
        status = 500 if path == "/pause" and self.server.refuse_pause else 200
        reply = {}
        if path == "/server_info":
            reply = {"vllm_config": {"model_config": {"dtype": self.server.serves}}}
        else:
            self.server.routes.append(path)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST  # noqa: N815 - /health

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def servers():
    started = []
    for _ in range(2):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Routes)
        server.routes, server.refuse_pause, server.serves = [], False, "torch.float32"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


class Recording:
    """vLLM's trainer-side transfer engine, standing in: each send reads its source to the end."""

    def __init__(self) -> None:
        self.source, self.received = None, []

    def send_weights(self) -> None:
        self.received.append([(name, tensor.clone()) for name, tensor in self.source])

    def shutdown(self) -> None:
        pass


def engine_over(servers, dtype: torch.dtype = torch.bfloat16,
                **kwargs) -> tuple[VLLMServerEngine, dict[str, Recording]]:
    transfers: dict[str, Recording] = {}

    def transfer_init(url: str) -> Recording:
        transfers[url] = Recording()
        return transfers[url]

    tokenizer = SimpleNamespace(eos_token_id=2)
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    engine = VLLMServerEngine(urls, tokenizer, dtype, record_logprobs=False, request_timeout=30,
                              server_timeout=1, transfer_init=transfer_init, **kwargs)
    return engine, transfers


def test_a_source_gathers_and_casts_each_tensor_only_as_the_pass_reaches_it():
    state = sharded_state()
    source = StreamedWeights.of(state, torch.bfloat16)
    Gathered.calls = 0
    assert source.collective and source.nbytes == 3 * 12 * 2 and Gathered.calls == 0
    stream = iter(source)
    name, tensor = next(stream)
    assert Gathered.calls == 1 and name == "layer0.weight" and tensor.dtype == torch.bfloat16
    assert torch.equal(tensor, state["layer0.weight"].as_subclass(torch.Tensor).to(torch.bfloat16))
    assert len(list(stream)) == 2 and Gathered.calls == 3
    assert [n for n, _ in source] == list(state) and Gathered.calls == 6  # each pass gathers anew


def test_a_one_shot_stream_is_kept_to_be_replayed():
    pairs = iter([("a", torch.ones(2)), ("b", torch.zeros(3))])
    source = StreamedWeights.of(pairs, torch.bfloat16)
    first, second = list(source), list(source)
    assert [n for n, _ in first] == [n for n, _ in second] == ["a", "b"] and not source.collective
    assert all(t.dtype == torch.bfloat16 for _, t in second)


def test_a_push_to_two_servers_is_one_pass_of_the_weights(servers):
    engine, transfers = engine_over(servers)
    state = sharded_state()
    Gathered.calls = 0
    engine.load_weights(state, version=1)
    engine.close()
    assert Gathered.calls == 3, "each tensor gathered once for both servers"
    assert len(transfers) == 2 and engine.alive == 2
    for transfer in transfers.values():
        (received,) = transfer.received
        assert [n for n, _ in received] == list(state)
        assert all(torch.equal(t, state[n].as_subclass(torch.Tensor).to(torch.bfloat16)) for n, t in received)
    for server in servers:
        assert server.routes == ["/pause", "/update_weight_version", "/resume"]


def test_a_server_that_refuses_its_pause_leaves_the_pass_to_the_others(servers):
    servers[0].refuse_pause = True
    engine, transfers = engine_over(servers)
    Gathered.calls = 0
    engine.load_weights(sharded_state(), version=1)
    engine.close()
    assert Gathered.calls == 3 and engine.alive == 1
    assert [len(t.received) for t in transfers.values()] == [1]


def test_with_no_server_paused_a_sharded_source_still_runs_its_pass(servers):
    """The other ranks wait in the pass's gathers: rank 0 runs it even when no server takes the weights."""
    for server in servers:
        server.refuse_pause = True
    engine, transfers = engine_over(servers)
    Gathered.calls = 0
    with pytest.raises(Exception, match="no vLLM server usable"):
        engine.load_weights(sharded_state(), version=1)
    engine.close()
    assert Gathered.calls == 3 and not transfers


def _push_on_rank(rank: int) -> list[tuple[str, list[float]]] | None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 4))
    reference = {name: tensor.to(torch.bfloat16).flatten().tolist() for name, tensor in model.state_dict().items()}
    fully_shard(model)
    source = StreamedWeights.of(model, torch.bfloat16)
    if rank != 0:
        source.take_part_in_gathers()
        return None
    pushed = [(name, tensor.flatten().tolist()) for name, tensor in source]
    return [(name, values) for name, values in pushed if values == reference[name]]


def test_under_fsdp_rank_0_streams_the_full_weights_while_the_other_rank_takes_part_in_the_gathers():
    from gloo_ranks import on_two_ranks

    full, other = on_two_ranks(functools.partial(_push_on_rank))
    assert other is None
    assert [name for name, _ in full] == ["0.weight", "0.bias", "1.weight", "1.bias"]


@pytest.mark.parametrize(("serves", "wire"), [("torch.bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_a_float32_learner_pushes_in_the_dtype_the_servers_serve(servers, serves, wire):
    """No float32 on the wire to servers that serve bf16 (they would cast it on arrival: the same numbers)."""
    for server in servers:
        server.serves = serves
    engine, transfers = engine_over(servers, dtype=torch.float32)
    engine.load_weights({"w": torch.ones(3)}, version=1)
    engine.close()
    assert [t.dtype for transfer in transfers.values() for _, t in transfer.received[0]] == [wire, wire]
