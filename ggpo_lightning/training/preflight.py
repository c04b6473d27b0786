"""Everything ``ggpo-train`` can check before a model's weights load, checked before they do.

Loading a large model takes minutes; a typo in a recipe, a missing file, a bad row or a
resume from a damaged checkpoint must not wait for it. :func:`check_run` runs on the
parsed recipe (``GGPOTrainCLI.before_instantiate_classes``) and checks:

- the data settings (:class:`~ggpo_lightning.training.data.PromptGroupDataModule`'s own checks),
  the prompt files (exist, UTF-8, JSON objects, non-empty prompts; errors name
  ``file:line``) and the behavior buffer file;
- the optimizer's learning rate;
- ``model.rollout.schedule: async`` against the data mode and the number of processes, and the separate vLLM
  engine against the number of processes;
- every prompt's token length against the model's context minus ``max_new_tokens``
  (the tokenizer and ``config.json`` load, the weights do not);
- the token ids of a behavior buffer against the model's vocabulary;
- the checkpoint to resume from: complete, and its checksum verified
  (:func:`~ggpo_lightning.records.integrity.check_checkpoint`).

The module checks its own settings first thing in its constructor, also before loading.
Prompts read from a ``datasets`` dataset (``data.dataset``) are checked when the run
loads them.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ggpo_lightning.records.errors import DataError, SettingsError
from ggpo_lightning.records.buffer import BehaviorBuffer
from ggpo_lightning.training.checkpoint_io import check_checkpoint
from ggpo_lightning.models.loading import looks_like_path
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.rollouts.engines import placement_run_errors
from ggpo_lightning.rollouts.group import ChatTemplate, encode_prompt
from ggpo_lightning.rollouts.source import async_run_errors
from ggpo_lightning.training.data import PromptGroupDataModule

__all__ = ["check_run", "check_prompt_lengths", "check_buffer_tokens"]


def check_run(config: dict[str, Any], ckpt_path: str | None) -> None:
    """Raise the first problem of the recipe ``config`` (a plain dict) that needs no model weights to find."""
    _check_optimizer(config["model"].get("optimizer"))
    _check_processes(config)
    datamodule = PromptGroupDataModule(**config["data"])  # its constructor checks the settings; reads no file
    datamodule.load_rows()
    model = config["model"]
    name = str(model["model_name_or_path"])
    if Path(name).expanduser().exists() or not looks_like_path(name):  # a missing folder: the module says so
        tokenizer, model_config = _tokenizer_and_config(name)
        check_prompt_lengths(datamodule.train_rows + datamodule.val_rows, tokenizer,
                             _context_length(model_config, tokenizer), _max_new_tokens(model),
                             model.get("chat_template"))
        if datamodule.buffer_path is not None:
            check_buffer_tokens(datamodule.buffer_path, model_config.vocab_size)
    if ckpt_path is not None:  # a sharded one under several processes: each hashes its share at the load
        sharded_load = Path(ckpt_path).is_dir() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        check_checkpoint(ckpt_path, content=not sharded_load)


def _check_optimizer(optimizer: Any) -> None:
    init_args = (optimizer.get("init_args") or {}) if isinstance(optimizer, dict) else {}
    lr = init_args.get("lr")
    if isinstance(lr, (int, float)) and not lr > 0:
        raise SettingsError(f"model.optimizer.init_args.lr must be > 0, got {lr}")


def _check_processes(config: dict[str, Any]) -> None:
    """``model.rollout.schedule: async`` and the separate vLLM engine with what they do not run with (their own
    settings: ``RolloutConfig.errors``): several processes, offline data."""
    rollout = config["model"].get("rollout") or {}
    trainer = config.get("trainer") or {}
    processes = 1
    for count in (str(trainer.get("devices")), str(trainer.get("num_nodes"))):  # "auto" and device lists pass
        processes *= int(count) if count.isdigit() else 1
    placement = RolloutConfig(engine=rollout.get("engine") or "hf",
                              vllm_placement=rollout.get("vllm_placement") or "colocated")
    errors = placement_run_errors(placement, processes)
    if rollout.get("schedule") == "async":
        errors += async_run_errors(config["data"].get("mode") or "online", processes)
    if errors:
        raise SettingsError(errors[0])


def _tokenizer_and_config(name_or_path: str):
    from transformers import AutoConfig

    from ggpo_lightning.models.loading import load_tokenizer

    return load_tokenizer(name_or_path), AutoConfig.from_pretrained(name_or_path)


def _context_length(model_config: Any, tokenizer: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 1_000_000 else None


def _max_new_tokens(model: dict[str, Any]) -> int:
    sampling = (model.get("rollout") or {}).get("sampling") or {}
    rollout = sampling.get("max_new_tokens") or next(
        f.default for f in fields(SamplingConfig) if f.name == "max_new_tokens")
    evaluation = (model.get("eval") or {}).get("max_new_tokens") or 0
    return max(rollout, evaluation)


def check_prompt_lengths(rows: list[PromptRow], tokenizer: Any, context: int | None, max_new_tokens: int,
                         chat_template: bool | ChatTemplate | dict[str, Any] | None) -> None:
    """Raise ValueError naming ``file:line`` of the first prompt whose tokens plus ``max_new_tokens`` exceed
    the model's ``context``.

    Cheap on large files and long lines: a prompt no longer in UTF-8 bytes than the room left
    passes untokenized (a tokenizer makes at most one token per byte: byte-level BPE,
    characters, sentencepiece with byte fallback; plus the template's own tokens), and one
    longer in characters than ``room`` times the longest vocabulary entry fails untokenized
    (each token covers at most that many characters).
    """
    if context is None:
        return
    room = context - max_new_tokens
    if room < 1:
        raise SettingsError(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the model's context "
                            f"of {context} tokens; lower model.rollout.sampling.max_new_tokens / "
                            "model.eval.max_new_tokens")
    overhead = len(encode_prompt(tokenizer, "", chat_template))
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    for row in rows:
        if row.messages is None and len(row.prompt.encode()) + overhead <= room:
            continue  # (a conversation's earlier turns count too: tokenized below)
        if len(row.prompt) > room * longest:
            length = f"at least {-(-len(row.prompt) // longest)}"
        else:
            length = len(encode_prompt(tokenizer, row.prompt, chat_template, row.messages))
            if length <= room:
                continue
        raise DataError(f"{row.source}: the prompt is {length} tokens; with max_new_tokens {max_new_tokens} "
                        f"it exceeds the model's context of {context} tokens (at most {room} prompt tokens); "
                        "shorten or drop the row, or lower max_new_tokens")


def check_buffer_tokens(path: str | Path, vocab_size: int) -> None:
    """Raise ValueError naming the buffer file and the group of the first token id outside ``[0, vocab_size)``."""
    for group in BehaviorBuffer.load_jsonl(path).groups():
        for ids in (group.prompt_ids, *group.response_ids):
            bad = [i for i in ids if not 0 <= i < vocab_size]
            if bad:
                raise DataError(f"{path}: group {group.prompt_id!r} has token id {bad[0]}, outside the model's "
                                f"vocabulary of {vocab_size}: the buffer was made with another tokenizer; "
                                "regenerate it with this model")
