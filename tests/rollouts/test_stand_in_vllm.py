"""The stand-in vLLM server (tests/stand_in_vllm.py) answers as vLLM 0.32's dev-mode server does, and its faults
happen when asked: the fleet's fault tests rely on both."""

from __future__ import annotations

import time

import pytest
import requests
from stand_in_vllm import GENERATE_ROUTE, StandInTransfer, in_background, until

PARAMS = {"n": 2, "temperature": 1.0, "max_tokens": 4, "logprobs": 0}


def generate(url: str, prompt: list[int], **fields) -> requests.Response:
    return requests.post(url + GENERATE_ROUTE, json={"token_ids": prompt, "sampling_params": PARAMS, **fields},
                         timeout=10)


def test_generate_answers_n_choices_tagged_with_the_version_of_the_last_push(stand_in_vllm):
    url = stand_in_vllm.url
    assert generate(url, [7, 8]).json()["choices"][0]["weight_versions"][0]["version"] == "default"
    transfer = StandInTransfer(url)
    transfer.source = [("w", None), ("b", None)]
    transfer.send_weights()
    requests.post(url + "/update_weight_version", json={"new_version": "3"}, timeout=5).raise_for_status()
    choices = generate(url, [7, 8]).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(c["token_ids"] == [8, 2] and c["finish_reason"] == "stop" for c in choices)
    assert all(c["weight_versions"] == [{"start": 0, "end": 2, "version": "3"}] for c in choices)
    assert [t["logprob"] for t in choices[0]["logprobs"]["content"]] == [-0.5, -0.5]
    assert requests.get(url + "/weight_info", timeout=5).json() == {"weight_version": "3"}
    assert stand_in_vllm.pushed_names == [["w", "b"]]
    assert stand_in_vllm.calls[1:5] == ["/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                                        "/finish_weight_update"]


def test_pause_keep_freezes_a_request_until_resume_and_its_tokens_straddle_the_push(stand_in_vllm):
    stand_in_vllm.reply_seconds = 0.2
    url = stand_in_vllm.url
    thread, out = in_background(lambda: generate(url, [5]))
    until(lambda: stand_in_vllm.held)
    requests.post(url + "/pause", params={"mode": "keep"}, timeout=5).raise_for_status()
    assert requests.get(url + "/is_paused", timeout=5).json() == {"is_paused": True}
    requests.post(url + "/update_weight_version", json={"new_version": "1"}, timeout=5)
    time.sleep(0.4)
    assert not out, "a request went on while paused (keep)"
    requests.post(url + "/resume", timeout=5)
    thread.join(5)
    spans = out[0].json()["choices"][0]["weight_versions"]
    assert [span["version"] for span in spans] == ["default", "1"]


def test_pause_wait_returns_once_the_requests_in_flight_finished(stand_in_vllm):
    stand_in_vllm.reply_seconds = 0.5
    thread, out = in_background(lambda: generate(stand_in_vllm.url, [5]))
    until(lambda: stand_in_vllm.held)
    requests.post(stand_in_vllm.url + "/pause", params={"mode": "wait"}, timeout=5).raise_for_status()
    assert not stand_in_vllm.held, "pause(wait) returned with a request in flight"
    thread.join(5)
    assert out[0].json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("abort", ["/abort_requests", "/pause?mode=abort"])
def test_an_aborted_request_answers_200_with_finish_reason_abort(stand_in_vllm, abort):
    stand_in_vllm.reply_seconds = 30
    thread, out = in_background(lambda: generate(stand_in_vllm.url, [5]))
    until(lambda: stand_in_vllm.held)
    requests.post(stand_in_vllm.url + abort, json={}, timeout=5).raise_for_status()
    thread.join(5)
    assert out[0].status_code == 200
    assert [c["finish_reason"] for c in out[0].json()["choices"]] == ["abort", "abort"]


def test_an_adapter_not_loaded_answers_404_and_unload_of_an_unknown_one_too(stand_in_vllm, tmp_path):
    url = stand_in_vllm.url
    loaded = requests.post(url + "/v1/load_lora_adapter", json={"lora_name": "v1", "lora_path": str(tmp_path)},
                           timeout=5)
    assert loaded.status_code == 200 and loaded.headers["content-type"] == "text/plain"
    assert generate(url, [5], model="v1").status_code == 200
    stand_in_vllm.forget_adapter("v1")
    missing = generate(url, [5], model="v1")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": "v1"}, timeout=5).status_code == 404


def test_injected_500s_and_dropped_connections_hit_the_next_calls_only(stand_in_vllm):
    stand_in_vllm.fail_next(GENERATE_ROUTE, times=2)
    assert [generate(stand_in_vllm.url, [5]).status_code for _ in range(3)] == [500, 500, 200]
    stand_in_vllm.drop_next(GENERATE_ROUTE)
    with pytest.raises(requests.ConnectionError):
        generate(stand_in_vllm.url, [5])
    assert generate(stand_in_vllm.url, [5]).status_code == 200


def test_death_mid_push_refuses_everything_until_a_restart_with_default_weights(stand_in_vllm):
    url = stand_in_vllm.url
    stand_in_vllm.reply_seconds = 30
    thread, out = in_background(lambda: pytest.raises(requests.ConnectionError, generate, url, [5]))
    until(lambda: stand_in_vllm.held)
    requests.post(url + "/update_weight_version", json={"new_version": "4"}, timeout=5)
    transfer = StandInTransfer(url)
    transfer.source = [("w", None)]
    stand_in_vllm.die_at("/update_weights")
    with pytest.raises(requests.ConnectionError):
        transfer.send_weights()
    thread.join(5)
    assert out, "the request in flight was answered by a dead server"
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/health", timeout=5)
    stand_in_vllm.restart()
    assert stand_in_vllm.url == url
    assert requests.get(url + "/health", timeout=5).status_code == 200
    assert requests.get(url + "/weight_info", timeout=5).json() == {"weight_version": "default"}


def test_the_transfer_records_a_shutdown_in_the_middle_of_a_push(stand_in_vllm):
    stand_in_vllm.slow("/update_weights", 0.5)
    transfer = StandInTransfer(stand_in_vllm.url)
    transfer.source = [("w", None)]
    thread, _ = in_background(transfer.send_weights)
    until(lambda: "/update_weights" in stand_in_vllm.calls)
    transfer.shutdown()
    thread.join(5)
    assert transfer.shut_down_while_sending


def test_a_request_that_arrived_while_paused_is_aborted_too(stand_in_vllm):
    requests.post(stand_in_vllm.url + "/pause", params={"mode": "keep"}, timeout=5).raise_for_status()
    thread, out = in_background(lambda: generate(stand_in_vllm.url, [5]))
    until(lambda: stand_in_vllm.queued)
    requests.post(stand_in_vllm.url + "/abort_requests", json={}, timeout=5).raise_for_status()
    thread.join(5)
    assert out[0].json()["choices"][0]["finish_reason"] == "abort"
