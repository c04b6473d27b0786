"""Loggers (issue 25, finding 4): TensorBoard and W&B through their extras (the real packages, W&B offline), a run
folder of its own for every run with every logger (issue 40), and sample completions."""

from __future__ import annotations

import json
from pathlib import Path


import pytest

from ggpo_lightning.cli.train import run_training
from ggpo_lightning.records.errors import FolderInUseError
from ggpo_lightning.training.samples import SAMPLES_FILE

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
LOGGERS = QUICKSTART.parent / "loggers"


def train(tmp_path: Path, model_dir: Path, *extra: str, export: bool = False):
    return run_training([
        "--config", str(QUICKSTART), *extra,
        "--model.model_name_or_path", str(model_dir), "--tiny_model", "null",
        "--model.rollout.k", "2", "--model.rollout.sampling.max_new_tokens", "3",
        "--data.train_path", str(tmp_path / "data" / "train.jsonl"), "--data.val_path", "null",
        "--synthetic_data.n_train", "16", "--synthetic_data.n_test", "4", "--data.prompts_per_step", "2",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.max_steps", "2",
        "--samples.every_n_steps", "1", "--samples.groups", "1", "--summary.export", str(export).lower(),
    ])


def samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / SAMPLES_FILE).read_text().splitlines()]


@pytest.mark.parametrize("overlay", ["csv", "tensorboard", "wandb"])
def test_a_second_run_gets_a_folder_of_its_own_and_leaves_the_first_untouched(tmp_path, tiny_model_dir, monkeypatch,
                                                                              overlay):
    """Issue 40: with W&B the run folder was ``save_dir`` itself, and a second run overwrote the first one's
    ``summary.json``, ``final_model/`` and ``config.yaml``. Every logger now writes each run into its own
    ``save_dir/quickstart/version_N/`` (checkpoints included)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    extra = () if overlay == "csv" else ("--config", str(LOGGERS / f"{overlay}.yaml"))

    def run() -> Path:
        run_dir = Path(train(tmp_path, tiny_model_dir, *extra, export=True).trainer.log_dir)
        if overlay == "wandb":
            import wandb

            wandb.finish()  # in one process the next WandbLogger would otherwise reuse this W&B run
            wandb.teardown()  # and W&B's service still writes the run's files after finish() returns
        return run_dir

    first = run()
    written = files(first)
    second = run()
    assert (first, second) == (tmp_path / "runs" / "quickstart" / "version_0",
                                tmp_path / "runs" / "quickstart" / "version_1")
    assert files(first) == written  # nothing of the first touched
    for run_dir in (first, second):
        assert (run_dir / "summary.json").is_file() and (run_dir / "config.yaml").is_file()
        assert (run_dir / "final_model" / "config.json").is_file()
        assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((first / "summary.json").read_text())["final_model"] == str(first / "final_model")
    if overlay == "wandb":  # W&B keeps its own files in the run folder
        assert len(list((first / "wandb").glob("offline-run-*"))) == len(list((second / "wandb").glob("offline-run-*"))) == 1


def files(folder: Path) -> dict[Path, bytes]:
    """The files under ``folder`` and their bytes (links left out: W&B links a debug log it shares between the
    runs of a process into each run's folder)."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


def test_a_version_named_in_the_recipe_that_holds_an_earlier_run_is_refused(tmp_path, tiny_model_dir):
    train(tmp_path, tiny_model_dir, "--trainer.logger.init_args.version", "0")
    with pytest.raises(FolderInUseError, match=r"version_0 holds an earlier run \(config.yaml, metrics.csv, "
                                               r"summary.json, checkpoints\); leave out trainer.logger.init_args.version"):
        train(tmp_path, tiny_model_dir, "--trainer.logger.init_args.version", "0")


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
    offline = list((Path(cli.trainer.log_dir) / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))
    tables = [json.loads(p.read_text()) for p in sorted((offline[0] / "files" / "media" / "table").glob("samples_*"))]
    rows = samples(Path(cli.trainer.log_dir))
    assert len(tables) == 2 and len(rows) == 4
    assert tables[0]["columns"] == ["step", "prompt_id", "prompt", "response", "reward", "length"]
    assert [row for table in tables for row in table["data"]] == [list(r.values()) for r in rows]
