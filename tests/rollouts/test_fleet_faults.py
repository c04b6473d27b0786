"""The fleet engine's faults against stand-in vLLM servers (tests/stand_in_vllm.py; no vLLM): a failed push leaves no
half-loaded server in use, replies from a server taken out are discarded, a request failure never shuts down a push,
retries are bounded and classified, requests wait on a condition, and a LoRA run's adapters survive 404s and stay
loaded while requests name them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from stand_in_vllm import GENERATE_ROUTE, StandInTransfer, StandInVLLM, in_background, until

from ggpo_lightning.rollouts.fleet.engine import RequestFailed, VLLMServerEngine
from ggpo_lightning.rollouts.protocol import AdapterWeights

EOS = 2


@pytest.fixture()
def servers():
    """Four stand-in servers (tests use the first few), stopped after the test."""
    started = [StandInVLLM(eos=EOS).start() for _ in range(4)]
    yield started
    for server in started:
        server.stop()


def tokenizer() -> SimpleNamespace:
    return SimpleNamespace(eos_token_id=EOS, batch_decode=lambda ids, skip_special_tokens: [str(i) for i in ids])


def engine_on(servers: list[StandInVLLM], transfers: list[StandInTransfer] | None = None,
              **kwargs) -> VLLMServerEngine:
    def transfer(url: str) -> StandInTransfer:
        made = StandInTransfer(url)
        if transfers is not None:
            transfers.append(made)
        return made

    settings = dict(record_logprobs=False, request_timeout=30, server_timeout=30) | kwargs
    return VLLMServerEngine([s.url for s in servers], tokenizer(), dtype=None, transfer_init=transfer, **settings)


def greedy_versions(engine: VLLMServerEngine, count: int) -> list[list[int]]:
    generations = engine.greedy([[10 + i] for i in range(count)], 4)
    assert all(g.response_ids[0][-1] == EOS for g in generations), "a partial (aborted) response was kept"
    return [g.versions[0] for g in generations]


def after_last(calls: list[str], route: str) -> list[str]:
    return calls[len(calls) - calls[::-1].index(route):]


# ---------------------------------------------------------------------- item 1: a failed push


def test_a_push_failing_mid_transfer_leaves_the_server_paused_out_and_its_requests_elsewhere(servers):
    a, b = servers[:2]
    engine = engine_on([a, b])
    engine.load_weights([], version=1)
    a.reply_seconds = b.reply_seconds = 1.0
    thread, out = in_background(lambda: greedy_versions(engine, 8))
    until(lambda: a.held and b.held)
    a.fail_next("/update_weights")
    engine.load_weights([], version=2)
    thread.join(30)
    (versions,) = out
    assert "/resume" not in after_last(a.calls, "/pause"), "the half-loaded server was resumed"
    assert "/abort_requests" in after_last(a.calls, "/pause")
    assert len(b.generate_bodies) == 8, "the failed server's requests were not sent to the other"
    assert engine.take_metrics()["server_retries"] == len(a.generate_bodies) > 0
    assert len(versions) == 8 and engine.alive == 1  # greedy_versions: no aborted (partial) response kept
    engine.close()


def test_a_server_whose_push_failed_is_used_again_only_after_a_full_push(servers):
    a, b = servers[:2]
    engine = engine_on([a, b])
    engine.load_weights([], version=1)
    a.fail_next("/update_weights")
    engine.load_weights([], version=2)
    assert engine.alive == 1 and greedy_versions(engine, 4) == [[2, 2]] * 4
    assert len(a.generate_bodies) == 0
    engine.take_metrics()
    engine.load_weights([], version=3)  # A answers /health: re-synced
    assert engine.take_metrics()["server_resyncs"] == 1 and engine.alive == 2
    a.reply_seconds = b.reply_seconds = 0.2
    assert greedy_versions(engine, 8) == [[3, 3]] * 8
    assert a.generate_bodies, "the re-synced server takes requests again"
    engine.close()


def test_a_reply_from_a_server_taken_out_after_the_request_was_sent_is_discarded(servers):
    """A request held on A when another request's failure takes A out: its reply (tagged with the weights A had,
    and straddling A's re-sync) is discarded, and the request sent again after the next push."""
    a, b = servers[:2]
    engine = engine_on([a, b])
    b.fail_next("/pause")  # B out from the start: A alone serves
    engine.load_weights([], version=1)
    a.reply_seconds = 1.0
    a.slow(GENERATE_ROUTE, 0.3)  # both requests reach A before either is answered
    a.fail_next(GENERATE_ROUTE)  # the first request to arrive fails: A out, the other one is held
    thread, out = in_background(lambda: greedy_versions(engine, 2))
    until(lambda: a.calls.count(GENERATE_ROUTE) == 2 and engine.alive == 0)
    engine.load_weights([], version=2)  # both answer /health: both re-synced
    thread.join(30)
    engine.close()
    assert out == [[[2, 2], [2, 2]]]


def test_a_request_failure_never_shuts_down_a_push_in_progress(servers):
    """A request held on A (paused ``keep``) times out while A's transfer runs: A is taken out, the transfer goes on
    to its end, the request is answered by B (with the new weights: the push pauses every server at once)."""
    a, b = servers[:2]
    transfers: list[StandInTransfer] = []
    engine = engine_on([a, b], transfers, request_timeout=1.0)
    engine.load_weights([], version=1)
    a.reply_seconds = 0.5
    a.slow("/update_weights", 2.5)
    thread, out = in_background(lambda: greedy_versions(engine, 1))
    until(lambda: a.held)
    engine.load_weights([], version=2)
    thread.join(30)
    engine.close()
    assert not any(t.shut_down_while_sending for t in transfers)
    assert out == [[[2, 2]]]  # answered by B, after the push that paused A and B at once
    assert a.pushed_names == [[], []], "the push to A did not reach its end"


# ---------------------------------------------------------------------- item 5: retries and waiting


def test_a_poison_request_is_one_line_naming_it_not_no_server_usable(servers):
    for server in servers:
        server.fail_next(GENERATE_ROUTE)  # each server fails the request once
    engine = engine_on(servers)
    engine.load_weights([], version=1)
    with pytest.raises(RequestFailed, match=r"^a request \(prompt of 3 tokens \[5, 6, 7\]\) failed on 3 servers in "
                                            r"turn; .*: ServerAnswered: /inference/v1/generate answered 500"):
        engine.greedy([[5, 6, 7]], 4)
    assert engine.alive == 1, "the request took out more servers than its bound"
    engine.close()


def test_a_reply_that_cannot_be_read_is_the_runs_error_and_no_server_is_taken_out(servers):
    a, b = servers[:2]
    engine = engine_on([a, b])
    engine.load_weights([], version=1)
    a.answer_next(GENERATE_ROUTE, {"choices": [{"index": 0}]})
    b.answer_next(GENERATE_ROUTE, {"choices": [{"index": 0}]})
    with pytest.raises(RequestFailed, match=r"reply of http://127.0.0.1:\d+ to a request \(prompt of 1 tokens \[5\]\) "
                                            r"cannot be read: KeyError: 'token_ids'"):
        engine.greedy([[5]], 4)
    assert engine.alive == 2
    engine.close()


def test_a_request_waits_for_a_usable_server_and_goes_once_a_push_makes_one(servers):
    (a,) = servers[:1]
    engine = engine_on([a])
    engine.load_weights([], version=1)
    a.fail_next(GENERATE_ROUTE)  # A out; the request waits
    thread, out = in_background(lambda: greedy_versions(engine, 1))
    until(lambda: engine.alive == 0)
    time.sleep(0.2)
    assert thread.is_alive(), "the request did not wait"
    engine.load_weights([], version=2)
    thread.join(5)
    assert out == [[[2, 2]]], "the push did not wake the waiting request"
    engine.close()


# ---------------------------------------------------------------------- item 2, server side: adapters


def adapter(revision: int = 0) -> AdapterWeights:
    return AdapterWeights(base=lambda: [], save=lambda folder: folder.mkdir(parents=True, exist_ok=True),
                          base_revision=revision)


def lora_engine(servers: list[StandInVLLM], run_dir) -> VLLMServerEngine:
    engine = engine_on(servers, lora_rank=4)
    engine.start(run_dir)
    return engine


def test_a_404_for_an_adapter_being_replaced_takes_no_server_out(servers, tmp_path):
    a, b = servers[:2]
    engine = lora_engine([a, b], tmp_path)
    engine.load_weights(adapter(), version=1)
    a.slow("/v1/load_lora_adapter", 1.0)
    b.slow("/v1/load_lora_adapter", 1.0)
    thread, _ = in_background(lambda: engine.load_weights(adapter(), version=2))
    until(lambda: a.calls.count("/v1/load_lora_adapter") == 2)  # the publish of v2 is under way
    a.forget_adapter("v1")  # evicted behind the engine's back: requests naming it get a 404
    b.forget_adapter("v1")
    versions = greedy_versions(engine, 4)
    thread.join(30)
    assert versions == [[2, 2]] * 4  # sent again once v2 was published
    assert engine.alive == 2
    engine.close()


def test_a_server_that_lost_the_current_adapter_is_taken_out_and_re_synced(servers, tmp_path):
    a, b = servers[:2]
    engine = lora_engine([a, b], tmp_path)
    engine.load_weights(adapter(), version=1)
    a.forget_adapter("v1")  # as after a restart
    a.reply_seconds = b.reply_seconds = 0.1
    assert greedy_versions(engine, 4) == [[1, 1]] * 4
    assert engine.alive == 1
    engine.load_weights(adapter(), version=2)
    assert engine.alive == 2 and "v2" in a.adapters
    engine.close()


def test_an_adapter_stays_loaded_while_a_request_names_it(servers, tmp_path):
    (a,) = servers[:1]
    engine = lora_engine([a], tmp_path)
    engine.load_weights(adapter(), version=1)
    a.reply_seconds = 1.5
    thread, out = in_background(lambda: greedy_versions(engine, 2))
    until(lambda: len(a.held) == 2)
    engine.load_weights(adapter(), version=2)
    engine.load_weights(adapter(), version=3)  # v1 is neither current nor new, but named in flight
    assert "v1" in a.adapters
    thread.join(30)
    assert out == [[[1, 1], [1, 1]]]
    engine.load_weights(adapter(), version=4)
    assert sorted(a.adapters) == ["v3", "v4"]
    engine.close()


def test_a_changed_base_unloads_the_old_adapters_before_the_server_serves_again(servers, tmp_path):
    (a,) = servers[:1]
    engine = lora_engine([a], tmp_path)
    engine.load_weights(adapter(), version=1)
    engine.load_weights(adapter(), version=2)
    engine.load_weights(adapter(revision=1), version=3)
    calls = after_last(a.calls, "/start_weight_update")
    assert a.adapters == {"v3": str(tmp_path / "adapters" / "v3")}
    assert a.calls.index("/v1/unload_lora_adapter") < len(a.calls) - len(calls), "unloaded after the new base"
    assert greedy_versions(engine, 2) == [[3, 3]] * 2
    engine.close()


# ---------------------------------------------------------------------- item 4: local servers supervised


class StandInFleet:
    """``LocalFleet`` standing in, over stand-in servers: ``revive`` restarts the ones killed."""

    def __init__(self, servers: list[StandInVLLM]) -> None:
        self.servers, self.log_dir = servers, None

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self) -> None:
        pass

    def revive(self) -> list[int]:
        dead = [i for i, server in enumerate(self.servers) if server.dead]
        for i in dead:
            self.servers[i].restart()
        return dead

    def stop(self) -> None:
        pass


def test_a_crashed_local_server_is_started_again_re_synced_and_counted(servers, tmp_path):
    a, b = servers[:2]
    engine = VLLMServerEngine([], tokenizer(), dtype=None, record_logprobs=False, fleet=StandInFleet([a, b]),
                              transfer_init=StandInTransfer)
    engine.start(tmp_path)
    engine.load_weights([], version=1)
    a.kill()
    assert greedy_versions(engine, 4) == [[1, 1]] * 4  # B answers
    engine.take_metrics()
    engine.load_weights([], version=2)
    metrics = engine.take_metrics()
    assert (metrics["server_restarts"], metrics["server_resyncs"], metrics["servers_alive"]) == (1, 1, 2)
    assert a.version == "2"
    engine.close()
