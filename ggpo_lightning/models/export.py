"""The final export of a run: ``final_model/`` (and with LoRA ``final_adapter/``), written atomically.

:func:`export_targets` says what to write; :func:`write_folder` writes one target into a
temporary folder beside it and renames it into place, so an interrupted export never
leaves a half-written model where a loader would find it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from ggpo_lightning.records.atomic import fsync_directory, remove_orphans, temporary_name
from ggpo_lightning.records.integrity import checksums, remove_sidecar, write_sidecar
from ggpo_lightning.core.distributed import world
from ggpo_lightning.models.lora import plain_state_dict, save_adapter
from ggpo_lightning.models.policy import Policy

__all__ = ["export_targets", "write_folder"]

Writer = Callable[[Path], None]
"""Writes one export's content into the folder it is given."""


def export_targets(policy: Policy, tokenizer, model_name_or_path: str, run_dir: Path) -> dict[Path, Writer]:
    """Each export folder of the run and the function that writes it.

    Full fine-tuning: ``final_model/``, the learner (transformers ``save_pretrained``).
    LoRA: ``final_adapter/``, the adapter as peft saves it, loadable with
    ``PeftModel.from_pretrained(base, path)``. Its base is the one the run started from,
    unless reference refreshes merged adapters into it: then that merged base is saved as
    ``final_adapter/base/`` and ``adapter_config.json`` names it (the adapter on the
    original base would not be the trained learner). With ``lora.export_merged`` also
    ``final_model/``: base and adapter merged, a plain transformers model. Each folder
    holds the tokenizer too.

    Sharded (FSDP2): every rank must call it (the full weights are gathered to rank 0,
    which alone gets the writer); the export is the same single ``save_pretrained``
    folder as from one process.
    """

    def with_tokenizer(save_model: Writer) -> Writer:
        def write(directory: Path) -> None:
            save_model(directory)
            tokenizer.save_pretrained(directory)

        return write

    learner = policy.learner
    if policy.lora is None:
        if policy.sharded:
            plain = _gathered_plain_model(learner)
            return {} if plain is None else {run_dir / "final_model": with_tokenizer(plain.save_pretrained)}
        return {run_dir / "final_model": with_tokenizer(learner.save_pretrained)}

    def save_plain(merged: bool) -> Writer:
        return lambda directory: learner.get_base_model().save_pretrained(
            directory, state_dict=plain_state_dict(learner, merged=merged))

    adapter_dir = run_dir / "final_adapter"

    def write_adapter(directory: Path) -> None:
        base = model_name_or_path
        if policy.lora_merges:
            with_tokenizer(save_plain(merged=False))(directory / "base")
            base = str((adapter_dir / "base").resolve())
        save_adapter(learner, directory, base)
        tokenizer.save_pretrained(directory)

    targets = {adapter_dir: write_adapter}
    if policy.lora.export_merged:
        targets[run_dir / "final_model"] = with_tokenizer(save_plain(merged=True))
    return targets


def _gathered_plain_model(learner: torch.nn.Module):
    """The sharded learner's full weights as a plain transformers model on rank 0 (None elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    state = get_model_state_dict(learner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world()[0] != 0:
        return None
    with torch.device("meta"):  # no second initialization: the weights are assigned
        plain = AutoModelForCausalLM.from_config(learner.config)
    plain.load_state_dict(state, assign=True)
    plain.tie_weights()
    return plain


def write_folder(target: Path, write: Writer) -> None:
    """``write`` into a temporary folder next to ``target``, then put it in place: no half-written exports.

    The folder (:func:`~ggpo_lightning.records.atomic.temporary_name`, so that a killed process's is
    found by :func:`~ggpo_lightning.records.atomic.remove_orphans`) is made by ``mkdir`` under the
    process umask: normal permissions, not the private 0700 of ``mkdtemp``. The rename is
    fsynced into the parent folder. The folder's files are hashed before the rename and
    their SHA-256 sidecar (``target.sha256``, :mod:`~ggpo_lightning.records.integrity`) is
    written after it; ``ggpo eval`` verifies it.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(target.parent)
    tmp = temporary_name(target)
    tmp.mkdir()
    try:
        write(tmp)
        digests = checksums(tmp)
        remove_sidecar(target)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_directory(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no orphan temporary folder
        raise
    write_sidecar(target, digests)
