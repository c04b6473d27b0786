"""A tiny Qwen3-shaped model folder for tests: ``Qwen3ForCausalLM`` (random weights, 2 layers) with the word-level
tiny tokenizer, Qwen3's special tokens and Qwen3's own chat template (``assets/qwen3/chat_template.jinja``,
vendored from the Qwen3 tokenizer_config.json; ``enable_thinking``, system turns). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ggpo_lightning.tasks.tiny_model import build_tiny_tokenizer

CHAT_TEMPLATE = Path(__file__).parent / "assets" / "qwen3" / "chat_template.jinja"
SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_WORDS = ["system", "user", "assistant", "Please", "reason", "step", "by", "put", "your", "final", "within",
              "boxed", "Be", "brief", "Tom", "has", "apples", "How", "many"]


def build_qwen3_model(path: Path) -> Path:
    """Write the tiny Qwen3-shaped model and its tokenizer to ``path`` (a ``save_pretrained`` folder)."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.add_tokens(CHAT_WORDS)
    tokenizer.chat_template = CHAT_TEMPLATE.read_text()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
