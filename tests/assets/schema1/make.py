"""Run with the previous release's code (PYTHONPATH=<checkout of e88fb87>): writes schema-1 checkpoints."""
import sys, torch, lightning as L
from pathlib import Path
from ggpo_lightning.tasks.arithmetic import ArithmeticTask, write_splits
from ggpo_lightning.models import build_tiny_model
from ggpo_lightning.testing import TINY_TEST_MODEL
from ggpo_lightning.module import GGPOModule, RolloutConfig
from ggpo_lightning.rollout import SamplingConfig
from ggpo_lightning.data import PromptGroupDataModule
out = Path(sys.argv[1])
model = build_tiny_model(out / "model", TINY_TEST_MODEL)
write_splits(ArithmeticTask(max_operand=9, ops="+"), out / "data", n_train=40, n_test=12, seed=0)
torch.manual_seed(0)
module = GGPOModule(str(model), verifier="numeric", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
                    rollout=RolloutConfig(k=3, sync_every=2, sampling=SamplingConfig(max_new_tokens=3)), ref_refresh_every=3)
dm = PromptGroupDataModule(str(out / "data" / "train.jsonl"), str(out / "data" / "test.jsonl"), prompts_per_step=3,
                           buffer_capacity=50, buffer_draw="uniform")
cb = L.pytorch.callbacks.ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=3, save_top_k=-1)
trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[cb])
trainer.fit(module, datamodule=dm)
torch.save({k: v for k, v in module.learner.state_dict().items()}, out / "final_learner.pt")
