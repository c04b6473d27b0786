"""Helpers for tests that train a GGPOModule in-process with a Lightning Trainer (tiny model, one-digit sums)."""

from __future__ import annotations

import tempfile

import lightning as L
import torch

from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.training.module import GGPOModule


def make_module(model_dir, **kwargs) -> GGPOModule:
    kwargs.setdefault("rollout", RolloutConfig(k=4, sampling=SamplingConfig(max_new_tokens=3)))
    kwargs.setdefault("verifier", "numeric")
    kwargs.setdefault("optimizer", lambda p: torch.optim.AdamW(p, lr=1e-2))
    return GGPOModule(str(model_dir), **kwargs)


def make_data(data_dir, **kwargs) -> PromptGroupDataModule:
    kwargs.setdefault("prompts_per_step", 3)
    return PromptGroupDataModule(str(data_dir / "train.jsonl"), str(data_dir / "test.jsonl"), **kwargs)


def fit(module, datamodule, steps, callbacks=(), tmp_path=None, ckpt_path=None, **trainer_kwargs):
    trainer_kwargs.setdefault("enable_checkpointing", False)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=list(callbacks),
                        default_root_dir=tmp_path or tempfile.mkdtemp(prefix="ggpo-test-"), **trainer_kwargs)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def fit_resumable(module, data_dir, tmp_path, steps, ckpt_path=None, save_at=None, accelerator="cpu"):
    """Fit with uniform replay on one ``accelerator``, checkpointing every ``save_at`` steps into ``tmp_path/ckpt``
    (or resuming from ``ckpt_path``); returns ``(module, datamodule, trainer)``."""
    dm = make_data(data_dir, buffer_capacity=50, buffer_draw="uniform")
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=save_at,
                                                     save_top_k=-1)] if save_at else []
    trainer = L.Trainer(max_steps=steps, accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=bool(save_at), limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=callbacks, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, dm, trainer
