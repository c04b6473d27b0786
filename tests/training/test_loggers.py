"""Loggers (issue 25, finding 4): TensorBoard and W&B through their extras (the real packages, W&B offline), the
run-directory lock with a logger that has a version but no folder, and sample completions."""

from __future__ import annotations

import json
from pathlib import Path


from ggpo_lightning.cli.train import lock_logger_directory, run_training
from ggpo_lightning.training.samples import SAMPLES_FILE

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
LOGGERS = QUICKSTART.parent / "loggers"


def train(tmp_path: Path, model_dir: Path, *extra: str):
    return run_training([
        "--config", str(QUICKSTART), *extra,
        "--model.model_name_or_path", str(model_dir), "--tiny_model", "null",
        "--model.rollout.k", "2", "--model.rollout.sampling.max_new_tokens", "3",
        "--data.train_path", str(tmp_path / "data" / "train.jsonl"), "--data.val_path", "null",
        "--synthetic_data.n_train", "16", "--synthetic_data.n_test", "4", "--data.prompts_per_step", "2",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.max_steps", "2",
        "--samples.every_n_steps", "1", "--samples.groups", "1", "--summary.export", "false",
    ])


def samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / SAMPLES_FILE).read_text().splitlines()]


def test_a_logger_with_a_version_but_no_folder_is_not_locked(tmp_path, monkeypatch):
    """W&B's logger takes a ``version`` and has ``log_dir = None``: ``Path(None)`` was a TypeError."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    from jsonargparse import dict_to_namespace

    config = dict_to_namespace({"logger": {"class_path": "lightning.pytorch.loggers.WandbLogger",
                                           "init_args": {"save_dir": str(tmp_path), "version": None, "project": "p"}}})
    assert lock_logger_directory(config) is None


def test_tensorboard_logs_scalars_and_sample_completions(tmp_path, tiny_model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = train(tmp_path, tiny_model_dir, "--config", str(LOGGERS / "tensorboard.yaml"))
    run_dir = Path(cli.trainer.log_dir)
    assert run_dir.parent.name == "quickstart" and (run_dir / "config.yaml").is_file()
    rows = samples(run_dir)
    assert [r["step"] for r in rows] == [1, 1, 2, 2]  # one group of K=2 responses per step
    assert set(rows[0]) == {"step", "prompt_id", "prompt", "response", "reward", "length"}
    assert all(r["reward"] in (0.0, 1.0) and 0 < r["length"] <= 3 for r in rows)
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0}).Reload()
    assert "train/loss" in events.Tags()["scalars"]
    texts = [e for e in events.Tensors("samples/text_summary")]
    assert [e.step for e in texts] == [1, 2]
    shown = texts[0].tensor_proto.string_val[0].decode()
    assert rows[0]["prompt"].replace("|", "\\|") in shown and "| step | prompt_id |" in shown


def test_wandb_offline_logs_the_run_and_the_samples_table(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cli = train(tmp_path, tiny_model_dir, "--config", str(LOGGERS / "wandb.yaml"))
    import wandb

    wandb.finish()
    offline = list((tmp_path / "runs" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))
    tables = [json.loads(p.read_text()) for p in sorted((offline[0] / "files" / "media" / "table").glob("samples_*"))]
    rows = samples(Path(cli.trainer.log_dir))
    assert len(tables) == 2 and len(rows) == 4
    assert tables[0]["columns"] == ["step", "prompt_id", "prompt", "response", "reward", "length"]
    assert [row for table in tables for row in table["data"]] == [list(r.values()) for r in rows]
