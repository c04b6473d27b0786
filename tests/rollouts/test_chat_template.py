"""Chat templates (issue 25, finding 6): a system prompt, template arguments (Qwen3's ``enable_thinking``) and
conversational rows, on a tiny Qwen3-shaped model whose tokenizer carries Qwen3's own template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ggpo_lightning.cli.train import run_training
from ggpo_lightning.models.loading import load_tokenizer
from ggpo_lightning.records.prompts import load_prompt_rows
from ggpo_lightning.rollouts.group import ChatTemplate, chat_settings, encode_prompt
from training_runs import make_module

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QWEN3_NO_THINKING = ("<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
                     "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def decode(tokenizer, ids):
    return tokenizer.decode(ids).removeprefix(tokenizer.bos_token)


def test_system_prompt_and_template_arguments_reach_qwen3s_template(qwen3_model_dir):
    tokenizer = load_tokenizer(qwen3_model_dir)
    chat = ChatTemplate(system="Be brief", kwargs={"enable_thinking": False})
    assert decode(tokenizer, encode_prompt(tokenizer, "1+1?", chat)) == QWEN3_NO_THINKING
    thinking = decode(tokenizer, encode_prompt(tokenizer, "1+1?", True))
    assert thinking == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"  # no system, thinking on
    assert decode(tokenizer, encode_prompt(tokenizer, "1+1?", {"system": "Be brief",
                                                                "kwargs": {"enable_thinking": False}})) \
        == QWEN3_NO_THINKING  # the recipe's dict form
    assert chat_settings(False) is None and chat_settings(None) is None


def test_conversational_rows_keep_their_turns_and_own_system_prompt(qwen3_model_dir, tmp_path):
    tokenizer = load_tokenizer(qwen3_model_dir)
    messages = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "1+1?"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": "2", "messages": messages}) + "\n")
    row = load_prompt_rows(path)[0]
    assert row.messages == tuple(messages)
    own_system = encode_prompt(tokenizer, row.prompt, ChatTemplate(system="other", kwargs={"enable_thinking": False}),
                               row.messages)
    assert decode(tokenizer, own_system) == QWEN3_NO_THINKING  # the row's system turn wins
    path.write_text(json.dumps({"prompt": "p", "answer": "2", "messages": "not a list"}) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:1: 'messages' must be a list"):
        load_prompt_rows(path)


def test_the_recipe_key_takes_the_settings_and_the_module_encodes_with_them(qwen3_model_dir, capsys):
    chat = '{"system": "Be brief", "kwargs": {"enable_thinking": false}}'
    with pytest.raises(SystemExit):
        run_training(["--config", str(RECIPES / "qwen3-1.7b-math.yaml"), "--model.chat_template", chat, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)["model"]["chat_template"]
    assert printed == {"system": "Be brief", "kwargs": {"enable_thinking": False}}
    module = make_module(qwen3_model_dir, chat_template=ChatTemplate(**printed))
    assert decode(module.tokenizer, module.group_rollout.encode("1+1?")) == QWEN3_NO_THINKING
