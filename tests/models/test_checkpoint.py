"""The checkpoint schema: round trip, old checkpoints (tests/assets/schema1, schema3*) resume and load in ggpo eval."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from ggpo_lightning.models.checkpoint import CHECKPOINT_KEY, SCHEMA_VERSION, RunState, learner_weights, read_checkpoint

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "schema1"


def test_a_schema_1_checkpoint_reads_into_the_schema():
    state = RunState.from_dict(read_checkpoint(ASSETS / "step3.ckpt")[CHECKPOINT_KEY])
    assert state.schema == 1 and state.fingerprint is None  # written before the schema had a version
    assert state.rollout.engine_version == 2  # synced at step 2, saved at 3
    assert state.rollout.engine_state is not None and len(state.ranks) == 1 and state.lora is None
    assert state.ranks[0].generated_samples == 3 * 3 * 3  # 3 steps x 3 prompts x K=3
    again = RunState.from_dict(state.to_dict())
    assert again.schema == SCHEMA_VERSION == 4  # written anew: the rollout side in one entry
    assert again.ranks == state.ranks and again.rollout.engine_state is state.rollout.engine_state


def test_a_schema_3_async_checkpoint_reads_its_backlog_from_the_datamodules_entry():
    checkpoint = read_checkpoint(ASSETS.parent / "schema3-7d63ac6" / "async_step3.ckpt")
    state = RunState.from_checkpoint(checkpoint)
    assert state.schema == 3 and state.rollout.prompts is None  # the DataModule's entry holds the prompt order
    assert state.rollout.backlog == checkpoint["PromptGroupDataModule"]["async"]
    assert [batch["version"] for batch in state.rollout.backlog["queued"]] == [1, 2]


def test_a_newer_schema_is_refused_naming_the_upgrade():
    state = read_checkpoint(ASSETS / "step3.ckpt")[CHECKPOINT_KEY]
    with pytest.raises(ValueError, match=f"schema {SCHEMA_VERSION + 1}, newer than .* upgrade ggpo-lightning"):
        RunState.from_dict({**state, "schema": SCHEMA_VERSION + 1})


def test_a_checkpoint_of_the_previous_release_resumes_where_it_would_have_gone(tiny_model_dir, data_dir):
    """The step-3 checkpoint written by the old GGPOModule, resumed by this code, reaches the old code's
    uninterrupted step-6 learner (bit for bit on the machine that wrote it; float tolerance elsewhere)."""
    from ggpo_lightning.training.data import PromptGroupDataModule
    from ggpo_lightning.training.module import GGPOModule
    from ggpo_lightning.core.objectives import ObjectiveConfig
    from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig

    torch.manual_seed(0)
    # the old run had no behavior anchor (now on by default for stale GGPO)
    module = GGPOModule(str(tiny_model_dir), verifier="numeric", objective=ObjectiveConfig(behavior_anchor=0.0),
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), ref_refresh_every=3,
                        rollout=RolloutConfig(k=3, sync_every=2, sampling=SamplingConfig(max_new_tokens=3)))
    data = PromptGroupDataModule(str(data_dir / "train.jsonl"), str(data_dir / "test.jsonl"), prompts_per_step=3,
                                 buffer_capacity=50, buffer_draw="uniform")
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        enable_checkpointing=False)
    trainer.fit(module, datamodule=data, ckpt_path=str(ASSETS / "step3.ckpt"))
    assert trainer.global_step == 6 and module.generated_samples == 6 * 3 * 3
    expected = torch.load(ASSETS / "step6_learner.pt", weights_only=True)
    for name, value in module.learner.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5)


def test_ggpo_eval_loads_the_learner_of_an_old_checkpoint(tiny_model_dir):
    from ggpo_lightning.evaluation.accuracy import load_model

    model, _ = load_model(ASSETS / "step3.ckpt", base_model=str(tiny_model_dir))
    saved = learner_weights(read_checkpoint(ASSETS / "step3.ckpt"))
    assert saved and all(torch.equal(value, saved[name]) for name, value in model.state_dict().items())


ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"


@pytest.mark.parametrize("asset,schedule,steps", [
    ("schema3", "sync", 6), ("schema3", "async", 5), ("schema3-7d63ac6", "sync", 6), ("schema3-7d63ac6", "async", 5)])
def test_schema_3_checkpoints_resume_to_the_same_learner(tiny_model_dir, data_dir, asset, schedule, steps, caplog):
    """Sync checkpoints (stale engine weights inside) and async ones (two batches produced ahead, in the DataModule's
    entry), written by the code before the RolloutSource (``schema3``: commit 5152331) and before the source had one
    owner (``schema3-7d63ac6``), resume to the learner that code reached: the async ones through their queued
    batches, which the rollout source's owner now reads from the DataModule's entry."""
    from ggpo_lightning.core.objectives import ObjectiveConfig
    from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
    from ggpo_lightning.training.data import PromptGroupDataModule
    from ggpo_lightning.training.module import GGPOModule

    sampling = SamplingConfig(max_new_tokens=3)
    rollout = (RolloutConfig(k=3, sync_every=2, sampling=sampling) if schedule == "sync" else
               RolloutConfig(k=3, sync_every=1, sampling=sampling, schedule="async", async_worker="thread",
                             max_staleness=2))
    torch.manual_seed(0)
    module = GGPOModule(str(tiny_model_dir), verifier="numeric", objective=ObjectiveConfig(behavior_anchor=0.0),
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), rollout=rollout, ref_refresh_every=3)
    module.resume_mismatch_ok = True  # the assets were written with other paths to the same model and data
    data = PromptGroupDataModule(str(data_dir / "train.jsonl"), str(data_dir / "test.jsonl"), prompts_per_step=3,
                                 buffer_capacity=50, buffer_draw="uniform" if schedule == "sync" else None)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        enable_checkpointing=False)
    checkpoint = ASSETS_DIR / asset / f"{schedule}_step3.ckpt"
    assert read_checkpoint(checkpoint)[CHECKPOINT_KEY]["schema"] == 3
    with caplog.at_level("WARNING"):
        trainer.fit(module, datamodule=data, ckpt_path=str(checkpoint))
    differences = [line for r in caplog.records if "different run" in r.getMessage()
                   for line in r.getMessage().splitlines()[1:]]
    assert differences and all(d.strip().startswith(("model.model_name_or_path", "training data train",
                                                      "training data bytes", "model.rollout.schedule"))
                               for d in differences), differences
    # written before the schedule was fingerprinted, the first async asset reads as sync (SETTINGS_ADDED)
    schedule_lines = [d.strip() for d in differences if d.strip().startswith("model.rollout.schedule")]
    mislabelled = asset == "schema3" and schedule == "async"
    assert schedule_lines == (["model.rollout.schedule: checkpoint 'sync', now 'async'"] if mislabelled else [])
    assert trainer.global_step == steps
    expected = torch.load(ASSETS_DIR / asset / f"{schedule}_step{steps}_learner.pt", weights_only=True)
    for name, value in module.learner.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5)
