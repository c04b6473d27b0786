"""Run with the code of commit 5152331 (PYTHONPATH=<checkout of 5152331>): schema-3 checkpoints of a sync and an
async run, written before the rollout redesign (issue 22), and the learners an uninterrupted/resumed run reaches.

    PYTHONPATH=<checkout> python make.py OUT      (1 torch thread)
"""
import sys
from pathlib import Path

import lightning as L
import torch

from ggpo_lightning.data import PromptGroupDataModule
from ggpo_lightning.module import GGPOModule
from ggpo_lightning.objectives import ObjectiveConfig
from ggpo_lightning.rollout import RolloutConfig, SamplingConfig
from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits
from ggpo_lightning.tasks.tiny_model import build_tiny_model
from ggpo_lightning.testing import TINY_TEST_MODEL

torch.set_num_threads(1)
out = Path(sys.argv[1])
model = build_tiny_model(out / "model", TINY_TEST_MODEL)
write_splits(ArithmeticTask(max_operand=9, ops="+"), out / "data", n_train=40, n_test=12, seed=0)


def run(rollout: RolloutConfig, max_steps: int, ckpt_dir: Path | None, ckpt_path: Path | None = None):
    torch.manual_seed(0)
    module = GGPOModule(str(model), verifier="numeric", objective=ObjectiveConfig(behavior_anchor=0.0),
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), rollout=rollout, ref_refresh_every=3)
    data = PromptGroupDataModule(str(out / "data" / "train.jsonl"), str(out / "data" / "test.jsonl"),
                                 prompts_per_step=3, buffer_capacity=50,
                                 buffer_draw="uniform" if rollout.mode == "sync" else None)
    callbacks = [] if ckpt_dir is None else [L.pytorch.callbacks.ModelCheckpoint(
        dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)]
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        enable_checkpointing=ckpt_dir is not None, callbacks=callbacks)
    trainer.fit(module, datamodule=data, ckpt_path=None if ckpt_path is None else str(ckpt_path))
    return module


sampling = SamplingConfig(max_new_tokens=3)
# sync: K=3, sync every 2, uniform replay; the checkpoint at step 3 holds the stale engine (synced at 2)
module = run(RolloutConfig(k=3, sync_every=2, sampling=sampling), 6, out / "sync")
(out / "sync" / "epoch=0-step=3.ckpt").rename(out / "sync_step3.ckpt")
torch.save(module.learner.state_dict(), out / "sync_step6_learner.pt")

# async (producer thread, bound 2): the checkpoint at step 3 holds batches produced ahead; resumed, the learner
# trains on exactly those, so its weights after them do not depend on timing
module = run(RolloutConfig(k=3, sync_every=1, sampling=sampling, mode="async", async_worker="thread",
                           max_staleness=2), 3, out / "async")
checkpoint = out / "async_step3.ckpt"
(out / "async" / "epoch=0-step=3.ckpt").rename(checkpoint)
queued = torch.load(checkpoint, weights_only=True)["PromptGroupDataModule"]["async"]["queued"]
assert queued, "no batch was queued at the checkpoint: run again"
module = run(RolloutConfig(k=3, sync_every=1, sampling=sampling, mode="async", async_worker="thread",
                           max_staleness=2), 3 + len(queued), None, checkpoint)
torch.save(module.learner.state_dict(), out / f"async_step{3 + len(queued)}_learner.pt")
print("queued batches:", len(queued), [b["version"] for b in queued])
