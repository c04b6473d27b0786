"""Every setting and every data row checked before the weights load; resume checks what it resumes; one run per
run directory."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from faultkit import run_dir, train_args
from ggpo_lightning.records.buffer import BehaviorBuffer
from ggpo_lightning.training.checkpoint_io import CheckpointError
from ggpo_lightning.models.export import write_folder
from ggpo_lightning.records.run_lock import RunDirectoryInUse, lock_run_directory, release_run_directory
from ggpo_lightning.testing import make_group
from ggpo_lightning.cli.train import run_training


@pytest.fixture()
def no_weights(monkeypatch):
    """Fails the test if the model's weights load: the error must come first."""
    def load(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the error")

    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm", load)


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def row(prompt: str, answer: str = "3") -> bytes:
    return json.dumps({"prompt": prompt, "answer": answer}).encode()


@pytest.mark.parametrize("extra,match", [
    (["--data.prompts_per_step", "0"], "data.prompts_per_step must be >= 1, got 0"),
    (["--model.verifier_timeout", "0"], "model.verifier_timeout must be > 0 seconds, got 0"),
    (["--data.train_path", "/nonexistent/train.jsonl"], "data.train_path /nonexistent/train.jsonl does not exist"),
    (["--model.verifier", "no_such_pkg.Verifier"], "model.verifier: No module named 'no_such_pkg'"),
    (["--model.verifier_health.patience", "0"], "model.verifier_health.patience must be >= 1"),
])
def test_config_errors_come_before_the_weights_load(tmp_path, tiny_model_dir, fault_data, no_weights, extra, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, *extra))


@pytest.mark.parametrize("objective,warned", [
    (["--model.objective.name", "grpo"], True),
    (["--model.objective.name", "grpo", "--model.objective.importance_sampling", "token_mask",
      "--model.objective.importance_sampling_clip_min", "0.5", "--model.objective.importance_sampling_clip_max", "5"],
     False),
    (["--model.objective.name", "ggpo"], False),
])
def test_grpo_without_a_correction_on_offline_data_is_warned_of_before_the_weights_load(
        tmp_path, tiny_model_dir, fault_data, monkeypatch, recwarn, objective, warned):
    class Loaded(Exception):
        """The preflight passed: the weights began to load."""

    def load(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm", load)
    with pytest.raises(Loaded):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--data.mode", "offline", *objective))
    messages = [str(w.message) for w in recwarn if "never moves stalls it" in str(w.message)]
    assert len(messages) == warned
    assert not warned or "recipes/baselines/grpo-icepop.yaml" in messages[0]


def test_a_negative_learning_rate_in_yaml_fails_before_the_weights_load(tmp_path, tiny_model_dir, fault_data,
                                                                       no_weights):
    overlay = tmp_path / "lr.yaml"
    overlay.write_text("model:\n  optimizer:\n    class_path: torch.optim.AdamW\n    init_args:\n      lr: -1\n")
    with pytest.raises(ValueError, match="model.optimizer.init_args.lr must be > 0, got -1"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--config", str(overlay)))


def test_a_non_utf8_byte_names_the_file_and_line(tmp_path, tiny_model_dir, fault_data, no_weights):
    bad = write_lines(tmp_path / "train.jsonl",
                      [row("1+2="), row("1+1=", "2"), b'{"prompt": "2+\xff=", "answer": "2"}'])
    with pytest.raises(ValueError, match=rf"{bad}:3: not UTF-8 \(byte 0xff at column 15\)"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--data.train_path", str(bad)))


@pytest.mark.parametrize("prompt", ["", " \t "])
def test_empty_and_whitespace_prompts_name_the_file_and_line(tmp_path, tiny_model_dir, fault_data, no_weights,
                                                             prompt):
    bad = write_lines(tmp_path / "train.jsonl", [row("1+2="), row(prompt)])
    with pytest.raises(ValueError, match=rf"{bad}:2: the prompt is empty"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--data.train_path", str(bad)))


def test_a_10_mb_prompt_line_fails_before_the_weights_load(tmp_path, tiny_model_dir, fault_data, no_weights):
    bad = write_lines(tmp_path / "train.jsonl", [row("1+2="), row("1" * 10_000_000)])
    with pytest.raises(ValueError, match=rf"{bad}:2: the prompt is at least \d+ tokens; with max_new_tokens 3 it "
                                         r"exceeds the model's context of 64 tokens"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--data.train_path", str(bad)))


def test_a_prompt_just_over_the_context_is_measured_in_tokens(tmp_path, tiny_model_dir, fault_data, no_weights):
    bad = write_lines(tmp_path / "train.jsonl", [row("1+2="), row("1+" * 40 + "=")])
    with pytest.raises(ValueError, match=rf"{bad}:2: the prompt is \d+ tokens; .*at most 61 prompt tokens"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--data.train_path", str(bad)))


def test_a_buffer_token_id_beyond_the_vocabulary_fails_before_the_weights_load(tmp_path, tiny_model_dir, fault_data,
                                                                              no_weights):
    buffer = BehaviorBuffer()
    buffer.add([make_group([1, 2], [[3, 4], [5, 1000]], [1.0, 0.0], prompt_id="q7")])
    buffer.save_jsonl(tmp_path / "buffer.jsonl")
    with pytest.raises(ValueError, match=r"buffer.jsonl: group 'q7' has token id 1000, outside the model's vocabulary "
                                         "of 40"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--data.mode", "offline",
                                "--data.buffer_path", str(tmp_path / "buffer.jsonl")))


def test_a_recipe_verifier_can_be_a_class_path(tmp_path, tiny_model_dir, fault_data):
    cli = run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier",
                                  "ggpo_verifiers.exact.NumericVerifier", "--trainer.max_steps", "1"))
    assert cli.trainer.global_step == 1  # trained with it (it used to be rejected as "unknown verifier")


def test_exported_folders_get_normal_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_folder(tmp_path / "final_model", lambda d: (d / "config.json").write_text("{}"))
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "final_model").stat().st_mode) == 0o755
    # no temporary folder left; the checksum sidecar beside the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model", "final_model.sha256"]


def test_a_second_run_into_the_same_version_directory_fails_at_once_naming_the_holder(tmp_path, tiny_model_dir,
                                                                                     fault_data, no_weights):
    holder = lock_run_directory(run_dir(tmp_path))
    try:
        with pytest.raises(RunDirectoryInUse, match=rf"in use by another ggpo-train \(pid {os.getpid()},"):
            run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--trainer.logger.init_args.version", "0"))
    finally:
        release_run_directory(holder)


# ----------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_model_dir, fault_data) -> Path:
    """The checkpoint folder of a 2-step run."""
    root = tmp_path_factory.mktemp("two-steps")
    run_training(train_args(root, tiny_model_dir, fault_data, "--trainer.max_steps", "2"))
    return run_dir(root) / "checkpoints"


def test_resume_with_other_data_or_settings_names_the_differences(tmp_path, tiny_model_dir, fault_data, two_steps):
    shorter = tmp_path / "train.jsonl"
    shorter.write_text("".join((fault_data / "train.jsonl").read_text().splitlines(keepends=True)[:12]))
    resume = ["--ckpt_path", str(two_steps / "last.ckpt"), "--trainer.max_steps", "3"]
    with pytest.raises(ValueError, match=r"(?s)written by a different run:.*model.rollout.k: checkpoint 4, now 2"
                                         r".*training data rows: checkpoint 24, now 12.*--resume_mismatch_ok true"):
        run_training(train_args(tmp_path / "a", tiny_model_dir, fault_data, *resume, "--model.rollout.k", "2",
                                "--data.train_path", str(shorter)))
    assert list((tmp_path / "a" / "quickstart").iterdir()) == []  # the refused resume left no version_0/ or lock
    with pytest.warns(UserWarning, match="covers 24 prompts, the training data has 12"):
        cli = run_training(train_args(tmp_path / "b", tiny_model_dir, fault_data, *resume, "--data.train_path",
                                      str(shorter), "--resume_mismatch_ok", "true"))
    assert cli.trainer.global_step == 3  # no IndexError on the shorter file


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_warning(tmp_path, tiny_model_dir, fault_data, two_steps,
                                                                   caplog):
    checkpoint = torch.load(two_steps / "last.ckpt", weights_only=False)
    del checkpoint["ggpo"]["fingerprint"]
    # schema 2's layout: the engine at the top, the prompt order with the data
    rollout = checkpoint["ggpo"].pop("rollout")
    checkpoint["ggpo"].update(schema=2, engine_version=rollout["engine_version"], engine_state=rollout["engine_state"])
    checkpoint["PromptGroupDataModule"].update(rollout["prompts"])
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with caplog.at_level(logging.WARNING, logger="ggpo_lightning.training.module"):
        cli = run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--ckpt_path", str(tmp_path / "old.ckpt"),
                                      "--trainer.max_steps", "3"))
    assert cli.trainer.global_step == 3
    assert any("predates run fingerprints (schema 2)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("damage,problem", [(0, r"is empty \(0 bytes\)"), (1000, "is corrupt")])
def test_an_empty_or_truncated_checkpoint_is_named_and_the_newest_loadable_suggested(
        tmp_path, tiny_model_dir, fault_data, two_steps, no_weights, damage, problem):
    folder = tmp_path / "checkpoints"
    shutil.copytree(two_steps, folder)
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[:damage])
    (folder / "epoch=0-step=2.ckpt").touch()  # the newest, but loadable
    with pytest.raises(CheckpointError,
                       match=rf"checkpoint {last} {problem}.*resume from {folder}/epoch=0-step=2.ckpt"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--ckpt_path", str(last)))


def test_the_data_fingerprint_tells_a_reordered_or_longer_file_apart(tmp_path, fault_data):
    from ggpo_lightning.models.checkpoint import fingerprint_differences, run_fingerprint
    from ggpo_lightning.training.data import PromptGroupDataModule

    lines = (fault_data / "train.jsonl").read_text().splitlines(keepends=True)
    variants = {"same": lines, "reordered": lines[::-1], "longer": lines + lines[:1]}
    prints = {}
    for name, content in variants.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(content))
        datamodule = PromptGroupDataModule(train_path=str(tmp_path / f"{name}.jsonl"))
        datamodule.load_rows()
        prints[name] = run_fingerprint({"model.objective.beta": 0.04}, datamodule.fingerprint())
    saved = prints["same"]
    reordered = fingerprint_differences(saved, {**prints["reordered"], "data": {**prints["reordered"]["data"],
                                                                                "train": saved["data"]["train"]}})
    assert [d.split(":")[0] for d in reordered] == ["training data order_sha256"]
    longer = [d.split(":")[0] for d in fingerprint_differences(saved, prints["longer"])]
    assert longer == ["training data bytes", "training data order_sha256", "training data rows", "training data train"]
    beta = fingerprint_differences(saved, run_fingerprint({"model.objective.beta": 0.1}, saved["data"]))
    assert beta == ["model.objective.beta: checkpoint 0.04, now 0.1"]
