"""Loading causal LMs and tokenizers: a local folder or a hub id, never a download of its own.

``load_causal_lm`` / ``load_tokenizer`` wrap ``from_pretrained`` with clear errors for a
missing folder and for an uncached model in offline mode (``HF_HUB_OFFLINE=1``). The
tiny CPU model of the quickstart lives in :mod:`ggpo_lightning.tasks.tiny_model`.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from huggingface_hub import is_offline_mode, try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ggpo_lightning.records.errors import MissingFileError, SettingsError

__all__ = ["load_causal_lm", "load_tokenizer", "looks_like_path"]

# "name" or "org/name": what the hub accepts as a model id.
_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


def looks_like_path(name: str) -> bool:
    if name.startswith(("/", "./", "../", "~", ".\\", "..\\")):
        return True
    separators = [s for s in (os.sep, os.altsep) if s]
    return any(s in name for s in separators) and not _HUB_ID.fullmatch(name)


def _in_hub_cache(repo_id: str, marker_files: Sequence[str], kwargs: dict[str, Any]) -> bool:
    # try_to_load_from_cache returns a path str when cached, else None or a "known missing" sentinel.
    return any(
        isinstance(try_to_load_from_cache(repo_id, f, cache_dir=kwargs.get("cache_dir"), revision=kwargs.get("revision")), str)
        for f in marker_files
    )


def _resolve_source(name_or_path: str | Path, kwargs: dict[str, Any], marker_files: Sequence[str]) -> str:
    """A local folder, or a hub id that ``from_pretrained`` can load without surprises.

    Raises :class:`~ggpo_lightning.records.errors.MissingFileError` (a ``FileNotFoundError``, so an ``OSError``) for
    a missing local path, and for a hub id that is not cached while offline (``HF_HUB_OFFLINE=1`` or
    ``local_files_only=True``).
    """
    name = str(name_or_path)
    local = Path(name).expanduser()
    if local.exists():
        return str(local)
    if isinstance(name_or_path, Path) or looks_like_path(name):
        raise MissingFileError(f"model folder {name!r} does not exist (resolved to {local.resolve()}); "
                               f"check the path, or build it first")
    offline = is_offline_mode() or kwargs.get("local_files_only", False)
    if offline and not _in_hub_cache(name, marker_files, kwargs):
        raise MissingFileError(f"{name!r} is neither a local folder nor a model in the Hugging Face cache, and downloads "
                      f"are off (HF_HUB_OFFLINE=1 or local_files_only). Download it first while online "
                      f"(`hf download {name}`), or pass the path of a local folder.")
    return name


def load_tokenizer(name_or_path: str | Path, **kwargs: Any) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with a pad token and left padding (for batched generation).

    A tokenizer without a pad token pads with its eos token, with a warning. ``kwargs``
    go to ``from_pretrained``. Errors as for ``load_causal_lm``.
    """
    source = _resolve_source(name_or_path, kwargs, ("tokenizer_config.json", "tokenizer.json", "config.json"))
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise SettingsError(f"the tokenizer of {name_or_path} has neither a pad nor an eos token; "
                                f"set tokenizer.pad_token before batching")
        warnings.warn(f"the tokenizer of {name_or_path} has no pad token; padding with its eos token "
                      f"{tokenizer.eos_token!r}", stacklevel=2)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise SettingsError(f"dtype must be a torch dtype, its name (e.g. 'bfloat16') or 'auto', got {dtype!r}")
    return value


def load_causal_lm(name_or_path: str | Path, dtype: torch.dtype | str | None = None, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` of a local folder or a hub id; never downloads in offline mode.

    Args:
        name_or_path: a local folder (``save_pretrained`` layout) or a hub id ``org/name``.
        dtype: parameter dtype (``torch.bfloat16``, ``"bfloat16"``, ``"auto"``); None: transformers' default.
        kwargs: passed to ``from_pretrained`` (e.g. ``revision``, ``attn_implementation``).

    Raises:
        FileNotFoundError: the argument is a path (exists, or starts with ``/``, ``./``,
            ``../``, ``~``, or has more separators than ``org/name``) that does not exist.
        FileNotFoundError: a hub id that is not cached while offline (``HF_HUB_OFFLINE=1``).
    """
    source = _resolve_source(name_or_path, kwargs, ("config.json",))
    if dtype is not None:
        kwargs["dtype"] = _as_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(source, **kwargs)
