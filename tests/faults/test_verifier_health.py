"""A verifier that fails its checks, or a run whose every response scores 0, stops with a checkpoint and a summary
saying why; a hang is warned about."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from faultkit import HERE, run_dir, train_args
from ggpo_lightning.training.verifier_health import (VerifierHealth, VerifierHealthConfig, VerifierHealthError,
                                                    ZeroRewardError)
from ggpo_lightning.cli.train import run_training


def counts(crashed=0, timeout=0, total=8):
    return {"crashed": crashed, "timeout": timeout, "total": total}


def test_an_abort_needs_patience_steps_in_a_row_over_the_share():
    health = VerifierHealth(VerifierHealthConfig(max_failed_share=0.5, patience=2))
    health.check_step(counts(crashed=8), step=0, verify_seconds=0, reward=0.5)
    health.check_step(counts(crashed=4), step=1, verify_seconds=0, reward=0.5)  # exactly half: not over, the streak ends
    health.check_step(counts(timeout=5), step=2, verify_seconds=0, reward=0.5)
    with pytest.raises(VerifierHealthError, match=r"failed 6 of 8 checks at step 3 \(3 crashed, 3 timed out\)"):
        health.check_step(counts(crashed=3, timeout=3), step=3, verify_seconds=0, reward=0.5)


def test_disabled_health_never_aborts_and_bad_settings_name_the_key():
    health = VerifierHealth(VerifierHealthConfig(enabled=False, patience=1))
    health.check_step(counts(crashed=8), step=0, verify_seconds=0, reward=0.5)
    health.check_evaluation(counts(crashed=8), "held-out evaluation")
    for _ in range(30):
        health.check_step(counts(), step=1, verify_seconds=0, reward=0.0)
    assert VerifierHealthConfig(max_failed_share=1.0, patience=0, max_zero_reward_steps=0).errors() == [
        "model.verifier_health.max_failed_share must be in [0, 1), got 1.0",
        "model.verifier_health.patience must be >= 1, got 0",
        "model.verifier_health.max_zero_reward_steps must be None or >= 1, got 0"]


def test_an_abort_needs_max_zero_reward_steps_in_a_row_at_reward_0():
    health = VerifierHealth(VerifierHealthConfig(max_zero_reward_steps=3))
    for step, reward in enumerate([0.0, 0.0, 0.01, 0.0, 0.0]):  # a single right response ends the streak
        health.check_step(counts(), step=step, verify_seconds=0, reward=reward)
    with pytest.raises(ZeroRewardError, match="every response scored 0 in the 3 steps up to step 5"):
        health.check_step(counts(), step=5, verify_seconds=0, reward=0.0)
    never = VerifierHealth(VerifierHealthConfig(max_zero_reward_steps=None))
    for step in range(100):
        never.check_step(counts(), step=step, verify_seconds=0, reward=0.0)
    assert never.zero_streak == 100  # counted, never acted on


def test_a_hang_that_costs_a_large_share_of_the_step_is_warned_about_once(caplog):
    health = VerifierHealth(VerifierHealthConfig(warn_wait_share=0.25, patience=99))
    health._step_start -= 10.0  # the step began 10 s ago
    with caplog.at_level(logging.WARNING, logger="ggpo_lightning.training.verifier_health"):
        health.check_step(counts(timeout=2), step=0, verify_seconds=9.0, reward=0.5)
        health._step_start -= 10.0
        health.check_step(counts(timeout=2), step=1, verify_seconds=9.0, reward=0.5)
    warnings = [r for r in caplog.records if "waited on the verifier" in r.getMessage()]
    assert len(warnings) == 1 and "2 check(s) timed out" in warnings[0].getMessage()


@pytest.fixture()
def plugins_importable(monkeypatch):
    """Verifier workers are new processes: they import the plugin through PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", str(HERE))


@pytest.mark.parametrize("plugin", ["plugins.Raises", "plugins.OutOfRange",
                                    pytest.param("plugins.Segfaults", marks=pytest.mark.slow)])
def test_a_verifier_failing_every_check_aborts_the_run_with_a_checkpoint(tmp_path, tiny_model_dir, fault_data,
                                                                         plugins_importable, plugin):
    with pytest.raises(VerifierHealthError, match="the verifier failed 8 of 8 checks at step 2"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier", plugin))
    summary = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "aborted" and "failed 8 of 8 checks" in summary["reason"]
    assert summary["optimizer_steps"] == 2
    assert Path(summary["checkpoint"]).is_file() and Path(summary["checkpoint"]).name == "aborted.ckpt"


def test_a_run_whose_every_response_scores_0_aborts_with_a_checkpoint(tmp_path, tiny_model_dir, fault_data,
                                                                      plugins_importable):
    with pytest.raises(ZeroRewardError, match="every response scored 0 in the 2 steps up to step 1"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier", "plugins.NeverRight",
                                "--model.verifier_health.max_zero_reward_steps", "2"))
    summary = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "aborted" and "every response scored 0" in summary["reason"]
    assert summary["optimizer_steps"] == 1 and Path(summary["checkpoint"]).name == "aborted.ckpt"  # the 2nd step stopped


def test_a_verifier_crashing_on_the_starting_evaluation_aborts_before_training(tmp_path, tiny_model_dir, fault_data,
                                                                               plugins_importable):
    with pytest.raises(VerifierHealthError, match="every one of the 4 verifier checks of the held-out evaluation"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier", "plugins.Raises",
                                "--data.val_path", str(fault_data / "test.jsonl")))
    summary = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["optimizer_steps"] == 0 and summary["checkpoint"] is None


def test_a_hanging_verifier_is_warned_about_and_aborts(tmp_path, tiny_model_dir, fault_data, plugins_importable,
                                                        caplog):
    with caplog.at_level(logging.WARNING, logger="ggpo_lightning.training.verifier_health"):
        with pytest.raises(VerifierHealthError, match=r"0 crashed, \d+ timed out"):
            run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier", "plugins.Hangs",
                                    "--model.verifier_timeout", "0.2", "--model.verifier_health.patience", "1"))
    assert sum("waited on the verifier" in r.getMessage() for r in caplog.records) == 1


def test_a_pair_that_times_out_twice_is_cached_as_a_timeout(plugins_importable):
    from ggpo_verifiers import Status

    from plugins import Hangs

    with Hangs(timeout=0.2, workers=1) as verifier:
        for _ in range(3):
            assert [o.status for o in verifier.evaluate_batch(["\\frac{1}{2}"], ["1"])] == [Status.TIMEOUT]
        assert (verifier.stats.timeout, verifier.stats.cache_hits) == (3, 1)  # the third cost no wait
