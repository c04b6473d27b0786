"""The fleet engine's requests against a stand-in server (plain HTTP, no vLLM): greedy decoding sends its prompts at once,
and both engines' requests carry the same sampling fields."""

from __future__ import annotations

from types import SimpleNamespace

from stand_in_vllm import StandInTransfer

from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.fleet.engine import VLLMServerEngine
from ggpo_lightning.rollouts.vllm.sampling import sampling_params

EOS = 2
REPLY_SECONDS = 0.3


def tokenizer() -> SimpleNamespace:
    return SimpleNamespace(eos_token_id=EOS, batch_decode=lambda ids, skip_special_tokens: [str(i) for i in ids])


def pushed_engine(url: str) -> VLLMServerEngine:
    engine = VLLMServerEngine([url], tokenizer(), dtype=None, record_logprobs=False, request_timeout=30,
                              server_timeout=30, transfer_init=StandInTransfer)
    engine.load_weights([], version=3)
    return engine


def sent_params(stand_in) -> list[dict]:
    return [body["sampling_params"] for body in stand_in.generate_bodies]


def test_greedy_sends_its_prompts_at_once_and_keeps_their_order(stand_in_vllm):
    stand_in_vllm.reply_seconds = REPLY_SECONDS
    engine = pushed_engine(stand_in_vllm.url)
    prompts = [[10 + i] for i in range(8)]
    try:
        generations = engine.greedy(prompts, 4)
    finally:
        engine.close()
    assert [g.response_ids for g in generations] == [[[p[0], EOS]] for p in prompts]
    assert [g.versions for g in generations] == [[[3, 3]]] * 8
    assert stand_in_vllm.most_in_flight > 1, "greedy sent one request at a time"  # each is held REPLY_SECONDS
    assert all(p["temperature"] == 0.0 and p["n"] == 1 and p["max_tokens"] == 4 for p in sent_params(stand_in_vllm))


def test_a_sampled_request_carries_the_fields_the_in_process_engine_gives_vllm(stand_in_vllm):
    engine = pushed_engine(stand_in_vllm.url)
    try:
        engine.generate([[5]], 3, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=6))
    finally:
        engine.close()
    (sent,) = sent_params(stand_in_vllm)
    assert sent == sampling_params(3, 0.7, 0.9, 6, sent["seed"], eos=EOS, record_logprobs=False)
    assert isinstance(sent["seed"], int) and sent["stop_token_ids"] == [EOS] and sent["logprobs"] is None
