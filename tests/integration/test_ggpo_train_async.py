"""End to end: ``ggpo-train`` with ``model.rollout.schedule: async`` (the producer thread; the HF engine, and the
separate vLLM engine in the ``vllm``-marked tests)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ggpo_lightning.cli.train import run_training

from test_ggpo_train import QUICKSTART, RECIPES, train


def metrics(run_dir: Path) -> list[dict[str, str]]:
    return [r for r in csv.DictReader(open(run_dir / "metrics.csv")) if r.get("train/loss")]


@pytest.mark.parametrize("sync_every,max_staleness", [(1, None), (2, 3)])
def test_an_async_run_trains_within_the_staleness_bound_and_logs_its_waits(tmp_path, tiny_model_dir, sync_every,
                                                                          max_staleness):
    bound = sync_every if max_staleness is None else max_staleness
    extra = [] if max_staleness is None else ["--model.rollout.max_staleness", str(max_staleness)]
    cli = train(tmp_path, tiny_model_dir, "--trainer.max_steps", "6", "--model.rollout.schedule", "async",
                "--model.rollout.sync_every", str(sync_every), *extra)
    run_dir = Path(cli.trainer.log_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["optimizer_steps"] == 6
    # the producer may have run ahead of the last step (at most `bound` batches), never behind it
    assert 6 * 4 * 8 <= summary["generated_samples"] <= (6 + bound + 1) * 4 * 8
    rows = metrics(run_dir)
    assert [int(r["step"]) for r in rows] == list(range(6))
    for row in rows:
        assert 0 <= float(row["train/staleness"]) <= float(row["train/staleness_max"]) <= bound, row
        assert float(row["train/over_staleness"]) == 0
        assert float(row["train/rollout_wait_seconds"]) >= 0 and float(row["train/async_queue"]) <= bound + 1
        assert float(row["train/verifier/total"]) == 4 * 8  # the verifier's counts of the step's own batch
    assert max(float(r["train/staleness_max"]) for r in rows) >= 1  # the producer did generate ahead
    assert not cli.model.rollout_loop.source.producer.running  # stopped before the final evaluation


@pytest.mark.parametrize("field,value,match", [
    ("--model.rollout.max_staleness", "-1", "model.rollout.max_staleness must be >= 0"),
    ("--data.mode", "offline", "model.rollout.schedule: async needs data.mode: online"),
    ("--trainer.devices", "2", r"model.rollout.schedule: async on several processes \(2\) needs "
                               r"model.rollout.engine: vllm_server .* got engine: 'hf'"),
    ("--model.rollout.engine", "vllm", "async with model.rollout.engine: vllm would run vLLM in the trainer "
                                       "process"),
])
def test_bad_async_settings_fail_before_the_model_loads(tmp_path, tiny_model_dir, field, value, match):
    with pytest.raises(ValueError, match=match):
        run_training(["--config", str(QUICKSTART), "--model.model_name_or_path", str(tmp_path / "missing"),
                      "--tiny_model", "null", "--model.rollout.schedule", "async", field, value])
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_the_async_quickstart_learns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe builds its model and data under runs/
    cli = run_training(["--config", str(QUICKSTART), "--config", str(RECIPES / "overlays" / "async.yaml")])
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    assert summary["accuracy_after"] > summary["accuracy_before"] + 0.1, summary
    rows = metrics(Path(cli.trainer.log_dir))
    assert max(float(r["train/staleness_max"]) for r in rows) <= 1
