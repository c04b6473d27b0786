"""Everything ``ggpo-train`` can check before a model's weights load, checked before they do.

Loading a large model takes minutes; a typo in a recipe, a missing file, a bad row or a
resume from a damaged checkpoint must not wait for it. :func:`check_run` runs on the
parsed recipe (``GGPOTrainCLI.before_instantiate_classes``) and checks:

- the data settings (:class:`~ggpo_lightning.training.data.PromptGroupDataModule`'s own checks),
  the prompt files (exist, UTF-8, JSON objects, non-empty prompts; errors name
  ``file:line``) and the behavior buffer file;
- the optimizer's learning rate;
- ``model.compile: true`` against the strategy (not with FSDP2) and this machine (a C++ compiler);
- ``model.rollout.schedule: async`` against the data mode and the number of processes;
- with ``model.rollout.servers`` given as URLs, that each server answers with the RL routes, the flags the trainer
  needs and this model's vocabulary;
- every prompt's token length against the model's context minus ``max_new_tokens``
  (the tokenizer and ``config.json`` load, the weights do not);
- the token ids of a behavior buffer against the model's vocabulary;
- the checkpoint to resume from: complete, and its checksum verified
  (:func:`~ggpo_lightning.records.integrity.check_checkpoint`);
- the memory the run will take per device (:mod:`~ggpo_lightning.models.memory`: printed, and refused when it
  exceeds the GPU's memory, or on CPU the host's available memory, unless ``--memory_check false``);
- with ``model.rollout.engine: vllm`` or ``vllm_server``, that vLLM is installed, and the optional packages the recipe needs
  (``peft`` for LoRA, ``wandb`` / ``tensorboard`` for their loggers, ``pyarrow`` for Parquet, ``datasets``);
- with ``model.chat_template``, that the tokenizer has a chat template that reads every ``kwargs`` name.

The module checks its own settings first thing in its constructor, also before loading.
Prompts read from a ``datasets`` dataset (``data.dataset``) are checked when the run
loads them.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from ggpo_lightning.core.distributed import launched_as_global_rank_zero
from ggpo_lightning.records.errors import DataError, MissingFileError, SettingsError
from ggpo_lightning.records.buffer import BehaviorBuffer
from ggpo_lightning.training.checkpoint_io import check_checkpoint
from ggpo_lightning.models.compiled import compile_errors
from ggpo_lightning.models.loading import looks_like_path
from ggpo_lightning.models.lora import LoraSettings
from ggpo_lightning.models.memory import MemoryEstimate, available_host_memory, estimate_memory, model_shape
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.core.microbatch import MicroBatchConfig
from ggpo_lightning.rollouts.config import (VLLM_GPU_MEMORY_SHARE, VLLM_INSTALL_HINT, RolloutConfig, SamplingConfig,
                                           vllm_available)
from ggpo_lightning.records.extras import installed, require
from ggpo_lightning.rollouts.group import ChatTemplate, chat_template_errors, encode_prompt
from ggpo_lightning.rollouts.source import async_run_errors
from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.training.settings import build_config, check_model_settings

__all__ = ["check_run", "check_prompt_lengths", "check_buffer_tokens", "check_memory", "run_memory_estimate"]


def check_run(config: dict[str, Any], ckpt_path: str | None) -> None:
    """Raise the first problem of the recipe ``config`` (a plain dict) that needs no model weights to find."""
    _check_optimizer(config["model"].get("optimizer"))
    check_model_settings(config["model"])  # the recipe's own consistency first, then what this machine has
    _check_processes(config)
    _check_compile(config)
    _check_engine_installed(config["model"].get("rollout") or {})
    _check_packages(config)
    datamodule = PromptGroupDataModule(**config["data"])  # its constructor checks the settings; reads no file
    _warn_clipped_grpo_offline(config)
    _warn_unused_server_keys(build_config(RolloutConfig, config["model"].get("rollout")))
    datamodule.load_rows()
    model = config["model"]
    name = str(model["model_name_or_path"])
    if Path(name).expanduser().exists() or not looks_like_path(name):  # a missing folder: the module says so
        tokenizer, model_config = _tokenizer_and_config(name)
        errors = chat_template_errors(tokenizer, model.get("chat_template"), name)
        if errors:
            raise SettingsError("; ".join(errors))
        check_prompt_lengths(datamodule.train_rows + datamodule.val_rows, tokenizer,
                             _context_length(model_config, tokenizer), _max_new_tokens(model),
                             model.get("chat_template"))
        prompt_tokens = _longest_prompt_tokens(datamodule.train_rows + datamodule.val_rows, tokenizer,
                                               model.get("chat_template"))
        _check_servers(model.get("rollout") or {}, tokenizer, prompt_tokens + _max_new_tokens(model), model.get("lora"))
        if datamodule.buffer_path is not None:
            check_buffer_tokens(datamodule.buffer_path, model_config.vocab_size)
        check_memory(run_memory_estimate(config, model_config, prompt_tokens), config.get("memory_check", True))
    if ckpt_path is not None:  # a sharded one under several processes: each hashes its share at the load
        sharded_load = Path(ckpt_path).is_dir() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        check_checkpoint(ckpt_path, content=not sharded_load)


def _check_optimizer(optimizer: Any) -> None:
    init_args = (optimizer.get("init_args") or {}) if isinstance(optimizer, dict) else {}
    lr = init_args.get("lr")
    if isinstance(lr, (int, float)) and not lr > 0:
        raise SettingsError(f"model.optimizer.init_args.lr must be > 0, got {lr}")


def _warn_clipped_grpo_offline(config: dict[str, Any]) -> None:
    """GRPO without an importance-sampling correction on offline data: PPO's ratio is then against a behavior that
    never moves, so each token stops learning once the learner passes the clip on it (docs/METHOD.md, "Against the
    corrections people run on stale rollouts"). Valid, so a warning; named with the keys that fix it."""
    objective = config["model"].get("objective") or {}
    if config["data"].get("mode") == "offline" and objective.get("name") == "grpo" and not objective.get(
            "importance_sampling"):
        warnings.warn("model.objective.name: grpo on offline data (data.mode: offline) without "
                      "model.objective.importance_sampling: its clip against a behavior that never moves stalls it "
                      "within 1-5 points of the starting model (3 seeds in docs/RESULTS.md, where GGPO gained 9-38); "
                      "train GGPO (recipes/offline.yaml) or add a correction (recipes/baselines/grpo-icepop.yaml)",
                      UserWarning, stacklevel=2)


def _warn_unused_server_keys(rollout: RolloutConfig) -> None:
    """The server engine's keys set while another engine runs (a server recipe with ``--model.rollout.engine hf``):
    valid, and left unused, so a warning naming them."""
    unused = rollout.unused_server_keys()
    if unused:
        warnings.warn(f"{', '.join(unused)} apply to model.rollout.engine: vllm_server only; with engine: "
                      f"{rollout.engine} they are left unused", UserWarning, stacklevel=2)


def _check_engine_installed(rollout: dict[str, Any]) -> None:
    """``model.rollout.engine: vllm`` or ``vllm_server`` where vLLM is not installed (the server engine pushes
    weights with vLLM's trainer-side transfer engines): one line with the two ways out. (The recipe itself is
    valid, and prints with ``--print_config``, on any machine.)"""
    engine = rollout.get("engine")
    if engine in ("vllm", "vllm_server") and not vllm_available():
        raise SettingsError(f"model.rollout.engine: {engine} needs vLLM, which is not installed here: "
                            f"{VLLM_INSTALL_HINT}; or sample with the HF engine: --model.rollout.engine hf")


def _check_servers(rollout: dict[str, Any], tokenizer: Any, context: int, lora: dict[str, Any] | None) -> None:
    """``model.rollout.servers`` given as URLs: each answers, runs with the RL routes and the flags the trainer needs
    (runtime LoRA adapters for a ``lora`` run), and serves this model's vocabulary with room for ``context`` tokens (:func:`~ggpo_lightning.rollouts.fleet.engine.
    server_errors`)."""
    servers = rollout.get("servers")
    if rollout.get("engine") != "vllm_server" or not isinstance(servers, list):
        return
    from ggpo_lightning.rollouts.fleet.server_checks import server_errors

    rank = build_config(LoraSettings, lora).r if lora else None
    errors = [error for url in servers for error in server_errors(url, tokenizer, context, rank)]
    if errors:
        raise SettingsError("model.rollout.servers: " + "; ".join(errors))


def _check_packages(config: dict[str, Any]) -> None:
    """The optional packages the recipe needs (:mod:`~ggpo_lightning.records.extras`), before the data is read or
    any weights load: ``peft`` for ``model.lora``, ``wandb`` or ``tensorboard`` for their loggers, ``pyarrow`` for
    Parquet prompts, ``datasets`` for ``data.dataset``."""
    if config["model"].get("lora"):
        require("peft", "model.lora (remove the section to train all weights)")
    loggers = (config.get("trainer") or {}).get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        class_name = str(logger.get("class_path", "") if isinstance(logger, dict) else "").rsplit(".", 1)[-1]
        if class_name == "WandbLogger":
            require("wandb", "trainer.logger WandbLogger")
        elif class_name == "TensorBoardLogger" and not installed("tensorboardX"):  # Lightning takes either
            require("tensorboard", "trainer.logger TensorBoardLogger")
    data = config["data"]
    for key in ("train_path", "val_path"):
        if str(data.get(key) or "").endswith(".parquet"):
            require("pyarrow", f"data.{key} (a Parquet file)")
    if data.get("dataset"):
        require("datasets", "data.dataset")


def _processes(trainer: dict[str, Any]) -> int:
    """The run's processes: ``trainer.devices`` x ``trainer.num_nodes`` (``auto`` and device lists count 1)."""
    processes = 1
    for count in (str(trainer.get("devices")), str(trainer.get("num_nodes"))):
        processes *= int(count) if count.isdigit() else 1
    return processes


def _check_processes(config: dict[str, Any]) -> None:
    """``model.rollout.schedule: async`` with what it does not run with (its own settings: ``RolloutConfig.errors``):
    several processes on an engine of their own, offline data."""
    rollout = config["model"].get("rollout") or {}
    processes = _processes(config.get("trainer") or {})
    if rollout.get("schedule") == "async":
        errors = async_run_errors(config["data"].get("mode") or "online", processes, rollout.get("engine") or "hf")
        if errors:
            raise SettingsError(errors[0])


def _strategy_name(trainer: dict[str, Any]) -> str:
    """``trainer.strategy`` as its class path or Lightning name (a dict's ``class_path``)."""
    strategy = trainer.get("strategy")
    return str(strategy.get("class_path") if isinstance(strategy, dict) else strategy)


def _check_compile(config: dict[str, Any]) -> None:
    """``model.compile: true`` with a sharding strategy (FSDP2, which :func:`compile_errors` refuses; the module's
    own check sees no trainer)."""
    sharded = any(name in _strategy_name(config.get("trainer") or {}) for name in SHARDING_STRATEGIES)
    errors = compile_errors(bool(config["model"].get("compile")), sharded)
    if errors:
        raise SettingsError(errors[0])


def _tokenizer_and_config(name_or_path: str):
    from transformers import AutoConfig

    from ggpo_lightning.models.loading import load_tokenizer

    try:
        tokenizer = load_tokenizer(name_or_path)
    except MissingFileError as error:  # a hub id that is not in the cache while offline
        raise MissingFileError(f"model.model_name_or_path: {error}") from None
    return tokenizer, AutoConfig.from_pretrained(name_or_path)


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


SHARDING_STRATEGIES = ("ModelParallelStrategy", "FSDPStrategy", "fsdp")
"""Strategies (class names, Lightning's names) that shard weights, gradients and optimizer state over the processes."""
OPTIMIZER_STATES = {"SGD": 1, "Adagrad": 1, "RMSprop": 1}
"""Optimizer state tensors per parameter, by class name (``SGD``: its momentum buffer); any other: 2 (Adam's)."""


def run_memory_estimate(config: dict[str, Any], model_config: Any, prompt_tokens: int) -> MemoryEstimate:
    """The per-device :class:`~ggpo_lightning.models.memory.MemoryEstimate` of the recipe ``config`` (a plain dict)
    for the model of ``model_config`` (its ``config.json``), prompts of up to ``prompt_tokens`` tokens."""
    model, trainer = config["model"], config.get("trainer") or {}
    rollout = build_config(RolloutConfig, model.get("rollout"))
    lora = build_config(LoraSettings, model["lora"]) if model.get("lora") else None
    processes = _processes(trainer)
    strategy_name = _strategy_name(trainer)
    sharded = processes > 1 and any(name in strategy_name for name in SHARDING_STRATEGIES)
    optimizer = model.get("optimizer")
    optimizer_name = str(optimizer.get("class_path", "") if isinstance(optimizer, dict) else "").rsplit(".", 1)[-1]
    momentum = ((optimizer or {}).get("init_args") or {}).get("momentum", 0) if isinstance(optimizer, dict) else 0
    states = 0 if optimizer_name == "SGD" and not momentum else OPTIMIZER_STATES.get(optimizer_name, 2)
    responses = -(-int(config["data"].get("prompts_per_step") or 1) // processes) * rollout.k  # this process's share
    row = prompt_tokens + _max_new_tokens(model)
    step_tokens = responses * row  # padded: every row as long as the longest
    budget = build_config(MicroBatchConfig, model.get("micro_batch")).max_tokens
    on_gpu = _on_gpu(trainer.get("accelerator"))
    device_memory, device = _device_memory(on_gpu)
    share = rollout.vllm_args.get("gpu_memory_utilization", VLLM_GPU_MEMORY_SHARE)
    return estimate_memory(
        model_shape(model_config, lora.target_modules if lora else None, lora.r if lora else 0),
        precision=trainer.get("precision") or "32-true", world_size=processes, sharded=sharded,
        lora=lora is not None, optimizer_states=states, gradient_checkpointing=model["gradient_checkpointing"],
        micro_batch_tokens=min(max(budget, row), step_tokens) if budget else step_tokens,
        logprob_chunk_size=model["logprob_chunk_size"], attention_row=0 if on_gpu else row,
        engine=rollout.engine,
        engine_bytes=rollout.torch_dtype.itemsize if rollout.torch_dtype else None,
        # under ModelParallelStrategy (FSDP2) the engine takes its own copy before the learner is sharded, even on one
        # process (GGPOModule.configure_model): it never shares the learner there
        engine_shares_learner=rollout.engine == "hf" and "ModelParallelStrategy" not in strategy_name
        and rollout.hf_engine_shares_learner(lora is not None),
        engine_tokens=min(rollout.sampling.generation_batch_size, responses) * row,
        vllm_memory=int(share * device_memory) if rollout.engine == "vllm" and on_gpu and device_memory else None,
        engine_overlaps=rollout.schedule == "async", device_memory=device_memory, device=device)


def check_memory(estimate: MemoryEstimate, enforce: bool = True) -> None:
    """Print ``estimate`` (the first process only) and, when ``enforce``, raise a one-line SettingsError naming the
    recipe key to change when it exceeds the device's memory."""
    if launched_as_global_rank_zero():
        print(estimate.table(), flush=True)
    if enforce and not estimate.fits():
        raise SettingsError(
            f"the run needs about {estimate.total / 1e9:.1f} GB per device, more than the "
            f"{estimate.device_memory / 1e9:.1f} GB of {estimate.device} (the estimate printed above): "
            f"{estimate.advice()}; "
            "--memory_check false starts it anyway")


def _on_gpu(accelerator: Any) -> bool:
    import torch

    name = str(accelerator).lower()
    return name in ("gpu", "cuda") or (name == "auto" and torch.cuda.is_available())


def _device_memory(on_gpu: bool) -> tuple[int | None, str]:
    """This process's GPU's memory, or on CPU the host's available memory (``/proc/meminfo``); None if unknown."""
    if on_gpu:
        import torch

        if not torch.cuda.is_available():
            return None, "the GPU"
        index = int(os.environ.get("LOCAL_RANK") or 0) % torch.cuda.device_count()
        return torch.cuda.get_device_properties(index).total_memory, f"GPU {index}"
    available = available_host_memory()
    return available, "the host" if available is None else "the host's available memory"


def _longest_prompt_tokens(rows: list[PromptRow], tokenizer: Any,
                           chat_template: bool | ChatTemplate | dict[str, Any] | None) -> int:
    """Tokens of the longest prompt in UTF-8 bytes, with its template (one row tokenized: cheap on any file); 0
    without rows (a ``datasets`` dataset's prompts load with the run: the estimate then counts responses only)."""
    if not rows:
        return 0
    row = max(rows, key=lambda r: len(r.prompt.encode()) + sum(len(str(m)) for m in r.messages or ()))
    return len(encode_prompt(tokenizer, row.prompt, chat_template, row.messages))


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
