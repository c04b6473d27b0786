"""VLLMServerEngine against real vLLM servers: weights pushed through vLLM's weight-transfer API (the package's
``ggpo_gloo`` backend on CPU) give each server the learner's greedy tokens and log-probs; responses carry their
weight versions, straddling a push made while they are generated; a killed server costs retries, not the run, and is
re-synced when it comes back; with none left the engine stops with one line naming each server.

Two servers of the wide tiny model (head size 32: vLLM's CPU attention has no kernel for 16), started once for the
module (``LocalFleet``: 20-50 s each on two cores) and always stopped. ``make test-vllm`` runs these.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest
import torch

from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.rollouts.config import SamplingConfig

pytestmark = pytest.mark.vllm

PROMPTS = [f"{a}+{b}=" for a in range(8) for b in range(4)]  # 32 prompts
FP32_TOLERANCE = 1e-4
"""Largest |server - learner| token log-prob difference accepted in float32 (other kernels, the same math)."""


@pytest.fixture(scope="module")
def fleet(wide_tiny_model_dir, tmp_path_factory):
    from ggpo_lightning.rollouts.fleet.launcher import LocalFleet

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two servers and the tests on two cores
    fleet = LocalFleet(str(wide_tiny_model_dir), 2, log_dir=tmp_path_factory.mktemp("servers"), dtype="float32",
                       extra_args=["--kv-cache-memory-bytes", str(64 << 20)])
    fleet.start()
    yield fleet
    fleet.stop()


@pytest.fixture()
def learner(wide_tiny_model_dir):
    """The folder's model with every weight moved (the tied embedding and output layer too): a push must carry it."""
    model = load_causal_lm(wide_tiny_model_dir, dtype="float32").eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


@pytest.fixture()
def tok(wide_tiny_model_dir):
    return load_tokenizer(wide_tiny_model_dir)


def engine_for(urls, tok, **kwargs):
    from ggpo_lightning.rollouts.fleet.engine import VLLMServerEngine

    return VLLMServerEngine(list(urls), tok, torch.float32, **kwargs)


def hf_greedy(model, tok, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return out[0, len(prompt):].tolist()


def learner_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])  # [1, T]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)  # [1, T, V]
    return logp[0, len(prompt) - 1:-1].gather(-1, torch.tensor(response)[:, None])[:, 0]  # [R]


@pytest.mark.parametrize("bucket_bytes", [None, 0, 16 << 10], ids=["buckets", "one-tensor-at-a-time", "tiny-buckets"])
def test_after_a_push_each_servers_greedy_tokens_equal_the_learners(fleet, learner, tok, bucket_bytes):
    """The learner's moved weights (the tied output layer included: vLLM's CPU kernels keep a packed copy of it,
    which a push that skips it would leave old) reach each server; its greedy tokens then equal transformers'. For
    every way of sending them: packed buckets, one tensor at a time, and buckets so small that a layer spans
    several, each receive buffer reused many times (what the reload still holds of one is copied out first)."""
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    expected = [hf_greedy(learner, tok, p, 8) for p in prompts]
    for url in fleet.urls:  # each server on its own: an engine of one
        engine = engine_for([url], tok, bucket_bytes=bucket_bytes)
        for version in (3, 4):  # the second push reuses the buffers of the first
            engine.load_weights(learner, version=version)
        generations = engine.greedy(prompts, 8)
        engine.close()
        assert [g.response_ids[0] for g in generations] == expected, url
        assert all(g.versions == [[4, 4]] for g in generations)


@pytest.mark.parametrize("concurrent_push", [True, False], ids=["at-once", "one-after-the-other"])
def test_a_push_to_both_servers_gives_each_the_learners_greedy_tokens(fleet, learner, tok, concurrent_push):
    """One push to both servers (one pass over the weights, each bucket broadcast to both at once; or one server
    after the other): every reply, whichever server gave it, is transformers' greedy continuation."""
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    expected = [hf_greedy(learner, tok, p, 8) for p in prompts]
    engine = engine_for(fleet.urls, tok, bucket_bytes=64 << 10, concurrent_push=concurrent_push)
    try:
        engine.load_weights(learner, version=5)
        assert engine.alive == 2
        generations = engine.greedy(prompts, 8)
    finally:
        engine.close()
    assert [g.response_ids[0] for g in generations] == expected
    assert all(g.versions == [[5, 5]] for g in generations)


def test_sampled_responses_carry_the_learners_log_probs_and_one_seed_per_prompt(fleet, learner, tok):
    engine = engine_for(fleet.urls, tok)
    engine.load_weights(learner, version=1)
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:8]]
    sampling = SamplingConfig(max_new_tokens=8)
    torch.manual_seed(5)
    first = engine.generate(prompts, 4, sampling)
    torch.manual_seed(5)
    again = engine.generate(prompts, 4, sampling)
    engine.close()
    assert [g.response_ids for g in first] == [g.response_ids for g in again]  # the seeds come from torch's RNG
    assert all(len(g.response_ids) == 4 for g in first)
    for g in first:
        for response, recorded in zip(g.response_ids, g.token_logprobs):
            torch.testing.assert_close(torch.tensor(recorded), learner_logprobs(learner, g.prompt_ids, response),
                                       atol=FP32_TOLERANCE, rtol=0)


def straddled(urls, tok, learner, mode: str, delay: float = 0.1) -> list[list[int]]:
    """The versions of responses generated while a push (version 0 -> 1) lands, ``delay`` seconds after the first
    request was sent, under ``in_flight_updates: mode``."""
    engine = engine_for(urls[:1], tok, in_flight_updates=mode)
    engine.load_weights(learner, version=0)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    generations = []
    worker = threading.Thread(target=lambda: generations.extend(
        engine.generate(prompts, 8, SamplingConfig(max_new_tokens=48))))
    worker.start()
    deadline = time.monotonic() + 30
    while not engine.servers[0].outstanding:  # the requests are sent
        assert time.monotonic() < deadline, "no request was sent within 30 s"
        time.sleep(0.005)
    time.sleep(delay)  # ... and being decoded
    engine.load_weights(learner, version=1)
    worker.join()
    engine.close()
    return [v for g in generations for v in g.versions]


def test_a_push_while_generating_keeps_the_requests_and_tags_their_tokens(fleet, learner, tok):
    """``keep``: requests in flight pause and go on with the new weights, their responses tagged [0, 1]; ``drain``:
    they finish with the old weights first, no response straddles. (Tried with longer and longer delays after the
    first request: the push must land while requests are being decoded, which depends on the machine's speed.)"""
    for delay in (0.02, 0.05, 0.1, 0.2, 0.4):
        versions = straddled(fleet.urls, tok, learner, "keep", delay)
        if [0, 1] in versions:
            break
    assert [0, 1] in versions and all(v in ([0, 0], [0, 1], [1, 1]) for v in versions), versions
    assert all(first == last for first, last in straddled(fleet.urls, tok, learner, "drain"))


def served_greedy(url: str, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """The greedy tokens of the server at ``url`` itself (vLLM's route, no engine in between)."""
    import requests

    params = {"n": 1, "temperature": 0.0, "max_tokens": max_new_tokens, "stop_token_ids": [eos], "detokenize": False}
    reply = requests.post(url + "/inference/v1/generate", json={"token_ids": prompt, "sampling_params": params},
                          timeout=60)
    reply.raise_for_status()
    return reply.json()["choices"][0]["token_ids"]


def test_a_killed_server_costs_retries_and_comes_back_re_synced(fleet, learner, tok, caplog):
    engine = engine_for(fleet.urls, tok, server_timeout=120)
    engine.load_weights(learner, version=1)
    assert engine.take_metrics()["servers_alive"] == 2
    dead = fleet.urls[0]
    os.killpg(fleet.servers[0].pid, signal.SIGKILL)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    with caplog.at_level(logging.WARNING):
        generations = engine.generate(prompts, 2, SamplingConfig(max_new_tokens=4))
    assert len(generations) == 32 and all(g.versions == [[1, 1], [1, 1]] for g in generations)
    metrics = engine.take_metrics()
    assert metrics["servers_alive"] == 1 and metrics["server_retries"] >= 1, metrics
    assert sum(dead in record.getMessage() for record in caplog.records) == 1  # named once

    fleet.restart(0)  # the same port, the folder's weights, its version reset
    engine.load_weights(learner, version=2)
    metrics = engine.take_metrics()
    assert metrics["servers_alive"] == 2 and metrics["server_resyncs"] == 1, metrics
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:8]]
    assert [served_greedy(dead, p, 8, tok.eos_token_id) for p in prompts] == [hf_greedy(learner, tok, p, 8) for p in prompts]
    engine.close()


def test_a_server_restarted_unnoticed_is_taken_out_not_trusted(fleet, learner, tok, caplog):
    """A server that restarted between two requests answers with the folder's weights (vLLM's version "default"):
    its responses are refused, it is taken out and the requests go to the other server."""
    engine = engine_for(fleet.urls, tok)
    engine.load_weights(learner, version=4)
    fleet.restart(1)  # behind the engine's back: no request of its failed
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    with caplog.at_level(logging.WARNING):
        generations = engine.generate(prompts, 2, SamplingConfig(max_new_tokens=4))
    assert all(g.versions == [[4, 4], [4, 4]] for g in generations)  # every response from pushed weights
    assert engine.take_metrics()["servers_alive"] == 1
    assert any(fleet.urls[1] in r.getMessage() and "ServerReset" in r.getMessage() for r in caplog.records)
    engine.load_weights(learner, version=5)  # and it is back after the next push
    assert engine.take_metrics() | {"weight_push_seconds": 0} == {"servers_alive": 2, "server_retries": 0,
                                                                   "server_resyncs": 1, "server_restarts": 0,
                                                                   "weight_push_seconds": 0}
    engine.close()


def test_a_request_the_servers_refuse_is_the_runs_error_not_theirs(fleet, learner, tok):
    """A prompt longer than the servers' context is refused (HTTP 400) by every server alike: raised at once,
    naming the server's reason, and no server is taken out."""
    from ggpo_lightning.rollouts.fleet.engine import RequestRejected

    engine = engine_for(fleet.urls, tok)
    engine.load_weights(learner, version=1)
    with pytest.raises(RequestRejected, match=r"refused /inference/v1/generate \(400\)"):
        engine.generate([[tok.bos_token_id] + [5] * 1000], 2, SamplingConfig(max_new_tokens=4))
    assert engine.take_metrics()["servers_alive"] == 2
    engine.close()


def test_with_every_server_gone_the_engine_stops_naming_each(tok, learner):
    from ggpo_lightning.rollouts.fleet.engine import ServersUnavailable

    engine = engine_for(["http://127.0.0.1:9", "http://127.0.0.1:10"], tok, server_timeout=2)
    start = time.monotonic()
    with pytest.raises(ServersUnavailable, match=r"model.rollout.server_timeout=2 s \(http://127.0.0.1:9: .*; "
                                                 r"http://127.0.0.1:10: "):
        engine.load_weights(learner, version=1)
    assert time.monotonic() - start < 30


def test_the_preflight_names_what_a_server_lacks(fleet, tok):
    from ggpo_lightning.rollouts.fleet.server_checks import server_errors

    assert server_errors(fleet.urls[0], tok, 16) == []
    [short] = server_errors(fleet.urls[0], tok, 10_000)
    assert "start it with a larger --max-model-len" in short
    [gone] = server_errors("http://127.0.0.1:9", tok, 16)
    assert gone.startswith("http://127.0.0.1:9 does not answer")


@pytest.fixture(scope="module")
def lora_fleet(wide_tiny_model_dir, tmp_path_factory):
    """One server that takes runtime LoRA adapters (rank 8)."""
    from ggpo_lightning.rollouts.fleet.launcher import LocalFleet

    fleet = LocalFleet(str(wide_tiny_model_dir), 1, log_dir=tmp_path_factory.mktemp("lora-servers"), dtype="float32",
                       max_lora_rank=8, extra_args=["--kv-cache-memory-bytes", str(64 << 20)])
    fleet.start()
    yield fleet
    fleet.stop()


def test_a_lora_run_publishes_the_adapter_alone_and_the_base_after_a_merge(lora_fleet, wide_tiny_model_dir, tok,
                                                                          tmp_path):
    """A LoRA learner's adapter reaches the server as an adapter (the base is pushed once), and the served greedy
    tokens equal transformers' with the adapter merged; after a reference refresh merged it into the base, the base
    is pushed again and a fresh adapter published."""
    from ggpo_lightning.models.lora import LoraSettings, merge_and_reset, plain_state_dict
    from ggpo_lightning.models.policy import Policy

    policy = Policy(load_causal_lm(wide_tiny_model_dir, dtype="float32").eval(),
                    LoraSettings(r=8, alpha=16.0, target_modules=["q_proj", "v_proj", "gate_proj"]))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.learner.named_parameters():
            if "lora_B" in name:  # a trained adapter, far from its zero start
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    engine = engine_for(lora_fleet.urls, tok, lora_rank=8)
    engine.start(tmp_path)
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:12]]
    merged = load_causal_lm(wide_tiny_model_dir, dtype="float32").eval()

    def expected() -> list[list[int]]:
        merged.load_state_dict(plain_state_dict(policy.learner, merged=True))
        return [hf_greedy(merged, tok, p, 8) for p in prompts]

    engine.load_weights(policy.adapter_weights(), version=0)  # the base (the run's first push) and the adapter
    with torch.no_grad():
        for name, parameter in policy.learner.named_parameters():
            if "lora_A" in name:
                parameter.mul_(1.5)
    engine.load_weights(policy.adapter_weights(), version=1)
    assert (tmp_path / "adapters" / "v1" / "adapter_config.json").exists()
    generations = engine.greedy(prompts, 8)
    assert [g.response_ids[0] for g in generations] == expected()
    assert all(g.versions == [[1, 1]] for g in generations)  # the adapter's version
    assert lora_fleet.servers and engine.servers[0].adapters == ["v0", "v1"]

    merge_and_reset(policy.learner)  # a reference refresh: the base changes, the adapter starts again at B = 0
    policy.lora_merges += 1
    engine.load_weights(policy.adapter_weights(), version=2)
    assert engine.servers[0].adapters == ["v2"]  # the old base's adapters unloaded
    assert [g.response_ids[0] for g in engine.greedy(prompts, 8)] == expected()
    engine.close()


def test_the_memory_estimate_counts_the_buckets_a_push_keeps():
    from ggpo_lightning.models.memory import PUSH_BUFFER_BYTES
    from ggpo_lightning.rollouts.fleet.gloo_backend import DEFAULT_BUCKET_BYTES, bucket_counts

    assert PUSH_BUFFER_BYTES == DEFAULT_BUCKET_BYTES
    # consecutive tensors of one dtype up to a bucket; a larger tensor is a bucket of its own; 0: one at a time
    assert bucket_counts([4, 4, 4, 10, 2], ["f", "f", "f", "f", "f"], 8) == [2, 1, 1, 1]
    assert bucket_counts([4, 4, 4], ["f", "b", "b"], 100) == [1, 2]
    assert bucket_counts([4, 4], ["f", "f"], 0) == []
