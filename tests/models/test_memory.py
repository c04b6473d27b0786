"""The memory estimate's parts, hand-computed on a tiny Qwen3 configuration (no weights anywhere)."""

from __future__ import annotations

import pytest
from transformers import Qwen3Config

from ggpo_lightning.models.memory import PUSH_BUFFER_BYTES, estimate_memory, layer_bytes_per_token, model_shape

# vocabulary 100, hidden 32, MLP 64, 2 layers, 2 heads of 16 (Q = 32), 1 key/value head (KV = 16), tied embeddings
CONFIG = Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)
# embeddings 100*32 = 3200; a layer: q 32*32 + k 32*16 + v 32*16 + o 32*32 = 3072, q/k norms 16 + 16,
# MLP 3*32*64 = 6144, two norms 2*32 -> 9312; 2 layers 18624; final norm 32: 3200 + 18624 + 32
P = 21856
# LoRA r=4 on q, k, v, o: 4*(32+32) + 4*(32+16) + 4*(32+16) + 4*(32+32) = 896 per layer
LORA = 1792


@pytest.fixture(scope="module")
def shape():
    return model_shape(CONFIG)


def test_parameters_are_counted_from_the_config_as_loading_makes_them(shape):
    assert shape.parameters == P and shape.lora_parameters == 0
    assert model_shape(CONFIG, ["q_proj", "k_proj", "v_proj", "o_proj"], 4).lora_parameters == LORA
    assert (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.head_dim,
            shape.vocab) == (2, 32, 64, 2, 1, 16, 100)


@pytest.mark.parametrize("precision,weights,gradients,optimizer,reference", [
    ("32-true", 4 * P, 4 * P, 8 * P, 4 * P),
    ("bf16-mixed", 4 * P + 2 * P, 4 * P, 8 * P, 4 * P),  # float32 master weights + autocast's bf16 copy
    ("bf16-true", 2 * P, 2 * P, 4 * P, 2 * P),
])
def test_weights_gradients_and_adam_state_per_precision(shape, precision, weights, gradients, optimizer, reference):
    estimate = estimate_memory(shape, precision=precision, micro_batch_tokens=1)
    assert (estimate.weights, estimate.gradients, estimate.optimizer, estimate.reference) == \
        (weights, gradients, optimizer, reference)


def test_fsdp_shards_model_state_by_the_world_size_and_ddp_does_not(shape):
    ddp = estimate_memory(shape, world_size=4, sharded=False, micro_batch_tokens=1)
    fsdp = estimate_memory(shape, world_size=4, sharded=True, micro_batch_tokens=1)
    assert (ddp.weights, ddp.gradients, ddp.optimizer, ddp.reference) == (4 * P, 4 * P, 8 * P, 4 * P)
    assert (fsdp.weights, fsdp.gradients, fsdp.optimizer, fsdp.reference) == (P, P, 2 * P, P)
    mixed = estimate_memory(shape, precision="bf16-mixed", world_size=4, sharded=True, micro_batch_tokens=1)
    assert mixed.weights == P  # FSDP2 gathers a layer at a time in bf16: no whole-model autocast copy


def test_lora_trains_the_adapter_only_and_keeps_no_reference(shape):
    lora_shape = model_shape(CONFIG, ["q_proj", "k_proj", "v_proj", "o_proj"], 4)
    estimate = estimate_memory(lora_shape, lora=True, micro_batch_tokens=1)
    assert (estimate.weights, estimate.gradients, estimate.optimizer, estimate.reference) == \
        (4 * P, 4 * LORA, 8 * LORA, 0)
    sgd = estimate_memory(lora_shape, lora=True, optimizer_states=0, micro_batch_tokens=1)
    assert sgd.optimizer == 0


def test_activations_per_micro_batch_by_hand(shape):
    # a layer per token, float32: residual and norms 6*32*4 = 768; q/k/v forms 5*32 + 4*16 = 224, MLP 4*64 = 256:
    # (224 + 256) * 4 = 1920 -> 2688 bytes; CPU math attention over rows of 10 tokens: 2 heads * 10 * 4 = 80 more
    assert layer_bytes_per_token(shape, 4, 4) == 2688
    assert layer_bytes_per_token(shape, 4, 4, attention_row=10) == 2768
    head = 3 * 8 * 100 * 4  # logits, log-softmax, gradient of a chunk of 8 tokens, float32
    plain = estimate_memory(shape, micro_batch_tokens=8, logprob_chunk_size=4096)
    assert plain.activations == 8 * 2 * 2688 + head
    checkpointed = estimate_memory(shape, micro_batch_tokens=8, gradient_checkpointing=True)
    assert checkpointed.activations == 8 * (2 * 32 * 4 + 2688) + head  # each layer's input + one layer recomputed
    assert estimate_memory(shape, micro_batch_tokens=16).activations > plain.activations


def test_the_engine_generates_while_the_learner_waits_unless_async(shape):
    kv = 2 * 2 * 1 * 16 * 2  # K and V, 2 layers, 1 head of 16, bf16: bytes per token
    hf = estimate_memory(shape, micro_batch_tokens=1, engine_bytes=2, engine_tokens=1000)
    assert (hf.engine_resident, hf.engine_generating) == (2 * P, 1000 * kv)
    assert hf.total == hf.weights + hf.gradients + hf.optimizer + hf.reference + 2 * P + max(hf.activations, 1000 * kv)
    overlapping = estimate_memory(shape, micro_batch_tokens=1, engine_bytes=2, engine_tokens=1000, engine_overlaps=True)
    assert overlapping.total == hf.total - max(hf.activations, 1000 * kv) + hf.activations + 1000 * kv
    shared = estimate_memory(shape, micro_batch_tokens=1, engine_shares_learner=True)
    assert shared.engine_resident == 0
    vllm = estimate_memory(shape, micro_batch_tokens=1, engine="vllm", vllm_memory=10**9)
    assert (vllm.engine_resident, vllm.engine_generating) == (0, 10**9)  # asleep while the learner trains
    servers = estimate_memory(shape, micro_batch_tokens=1, engine="vllm_server", engine_bytes=2)  # devices of their own
    # a push streams: one full tensor at a time (the embedding the largest) and two packed buckets, never the model
    assert servers.engine_resident == 0
    assert servers.engine_generating == shape.vocab * shape.hidden * (2 * 4 + 2) + 2 * PUSH_BUFFER_BYTES


def test_the_advice_names_the_part_that_would_make_it_fit(shape):
    big_batch = estimate_memory(shape, micro_batch_tokens=100_000, device_memory=10**6, device="GPU 0")
    assert not big_batch.fits()
    assert big_batch.advice().startswith("lower model.micro_batch.max_tokens") and "gradient_checkpointing" in \
        big_batch.advice()
    engine = estimate_memory(shape, micro_batch_tokens=1, engine="vllm", vllm_memory=10**9, device_memory=10**8)
    assert "model.rollout.vllm_args.gpu_memory_utilization" in engine.advice()
    state = estimate_memory(shape, micro_batch_tokens=1, device_memory=1000)
    assert "trainer.precision" in state.advice() and "model.lora" in state.advice()
    assert estimate_memory(shape, micro_batch_tokens=1, device_memory=10**9).fits()
    table = big_batch.table()
    for part in ("weights", "gradients", "optimizer state", "reference", "activations", "rollout engine", "total",
                 "of 0.0 GB (GPU 0)"):
        assert part in table
