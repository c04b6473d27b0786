"""Checkpoints you can trust: every checkpoint and export has a SHA-256 sidecar, verified before it loads (resume,
``ggpo eval``, the "newest loadable" suggestion); a full disk stops a save cleanly."""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from faultkit import orphans, run, run_dir, train_args, weights
from ggpo_lightning.models.export import write_folder
from ggpo_lightning.records.errors import CheckpointError
from ggpo_lightning.records.integrity import Integrity, check_checkpoint, checksums, sidecar, verify, write_sidecar
from ggpo_lightning.cli.train import run_training


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_model_dir, fault_data) -> Path:
    """The checkpoint folder of a 2-step run (``last.ckpt``, ``epoch=0-step=2.ckpt`` and their sidecars)."""
    root = tmp_path_factory.mktemp("two-steps")
    run_training(train_args(root, tiny_model_dir, fault_data, "--trainer.max_steps", "2"))
    return run_dir(root) / "checkpoints"


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def test_every_checkpoint_has_a_sidecar_that_sha256sum_accepts(two_steps):
    names = sorted(p.name for p in two_steps.iterdir())
    assert names == ["epoch=0-step=2.ckpt", "epoch=0-step=2.ckpt.sha256", "last.ckpt", "last.ckpt.sha256"]
    for name in ("last.ckpt", "epoch=0-step=2.ckpt"):
        assert verify(two_steps / name).status is Integrity.VERIFIED
    copy = two_steps.parent / "renamed.ckpt"  # a copy renamed with its sidecar still verifies
    shutil.copy(two_steps / "last.ckpt", copy)
    shutil.copy(sidecar(two_steps / "last.ckpt"), sidecar(copy))
    try:
        assert verify(copy).status is Integrity.VERIFIED
    finally:
        copy.unlink()
        sidecar(copy).unlink()
    if shutil.which("sha256sum"):  # the standard tool reads the same file
        done = subprocess.run(["sha256sum", "-c", "last.ckpt.sha256"], cwd=two_steps, capture_output=True, text=True)
        assert done.returncode == 0 and "last.ckpt: OK" in done.stdout, done.stdout + done.stderr


def test_a_bit_flip_at_each_of_10_seeded_offsets_is_detected(tmp_path, two_steps):
    size = (two_steps / "last.ckpt").stat().st_size
    rng = random.Random(26)
    offsets = sorted(rng.randrange(size) for _ in range(10))
    for offset in offsets:
        folder = tmp_path / f"at-{offset}"
        shutil.copytree(two_steps, folder)
        last = folder / "last.ckpt"
        flip_bit(last, offset, bit=rng.randrange(8))
        with pytest.raises(CheckpointError, match=rf"checkpoint {last} is damaged: {last} does not match its "
                                                  rf"checksum.*resume from {folder}/epoch=0-step=2.ckpt \(the newest "
                                                  "checkpoint there that verifies\)"):
            check_checkpoint(last)


def test_64_flipped_bytes_stop_the_resume_before_the_weights_load(tmp_path, tiny_model_dir, fault_data, two_steps,
                                                                 monkeypatch):
    """The issue's trial: 64 bytes flipped in the middle of last.ckpt used to train on to exit 0."""
    monkeypatch.setattr("ggpo_lightning.training.module.load_causal_lm",
                        lambda *a, **k: pytest.fail("the weights loaded before the error"))
    folder = tmp_path / "checkpoints"
    shutil.copytree(two_steps, folder)
    last = folder / "last.ckpt"
    middle = last.stat().st_size // 2
    data = bytearray(last.read_bytes())
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    last.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{last} is damaged.*resume from {folder}/epoch=0-step=2.ckpt"):
        run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--ckpt_path", str(last)))


def test_the_newest_loadable_search_skips_damaged_files_and_prefers_verified_ones(tmp_path, two_steps):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    source = two_steps / "last.ckpt"
    for age, name in enumerate(["last.ckpt", "damaged.ckpt", "unverified.ckpt", "verified.ckpt"]):
        shutil.copyfile(source, folder / name)
        if name != "unverified.ckpt":
            write_sidecar(folder / name, checksums(folder / name))
        os.utime(folder / name, (1e9 - age, 1e9 - age))  # newest first, in list order
    flip_bit(folder / "last.ckpt", 100)
    flip_bit(folder / "damaged.ckpt", 100)
    with pytest.raises(CheckpointError, match=rf"resume from {folder}/verified.ckpt \(the newest checkpoint there "
                                              "that verifies\)"):
        check_checkpoint(folder / "last.ckpt")
    (folder / "verified.ckpt").unlink()
    with pytest.raises(CheckpointError, match=rf"resume from {folder}/unverified.ckpt \(the newest loadable one "
                                              "there; unverified"):
        check_checkpoint(folder / "last.ckpt")


def test_a_checkpoint_without_a_sidecar_resumes_with_a_warning(tmp_path, tiny_model_dir, fault_data, two_steps,
                                                               caplog):
    folder = tmp_path / "checkpoints"
    shutil.copytree(two_steps, folder)
    sidecar(folder / "last.ckpt").unlink()  # as written before checksums
    with caplog.at_level(logging.WARNING, logger="ggpo_lightning.records.integrity"):
        cli = run_training(train_args(tmp_path, tiny_model_dir, fault_data, "--ckpt_path", str(folder / "last.ckpt"),
                                      "--trainer.max_steps", "3"))
    assert cli.trainer.global_step == 3
    assert any("is not verified: it has no checksum file last.ckpt.sha256" in r.getMessage()
               for r in caplog.records)
    assert verify(run_dir(tmp_path) / "checkpoints" / "last.ckpt").status is Integrity.VERIFIED  # new ones have one


def test_a_share_of_a_sharded_folder_finds_damage_only_in_its_own_files(tmp_path):
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt"):
        (folder / name).write_bytes(name.encode() * 100)
    write_sidecar(folder, checksums(folder))
    flip_bit(folder / "__1_0.distcp", 7)
    names = sorted(checksums(folder))  # the order the shares split
    shares = [verify(folder, share=(rank, 2)) for rank in range(2)]
    damaged_rank = names.index("__1_0.distcp") % 2
    assert shares[damaged_rank].status is Integrity.MISMATCH and "__1_0.distcp" in shares[damaged_rank].detail
    assert shares[1 - damaged_rank].status is Integrity.VERIFIED
    assert verify(folder).status is Integrity.MISMATCH


def test_ggpo_eval_refuses_a_damaged_export_and_checkpoint(tmp_path, two_steps):
    from ggpo_lightning.cli.main import main

    export = tmp_path / "run" / "final_model"
    write_folder(export, lambda d: (d / "model.safetensors").write_bytes(bytes(range(256)) * 64))
    assert sidecar(export).read_text().endswith("  final_model/model.safetensors\n")
    flip_bit(export / "model.safetensors", 4000)
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"problem": "1+1=", "answer": "2"}\n')
    for source in (export, export.parent):  # the folder, and the run directory that holds it
        result = CliRunner().invoke(main, ["eval", str(source), str(bench)])
        assert result.exit_code != 0
        assert f"export {export} is damaged: {export}/model.safetensors does not match" in result.output
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir()
    shutil.copy(two_steps / "last.ckpt", checkpoint)
    shutil.copy(sidecar(two_steps / "last.ckpt"), sidecar(checkpoint))
    flip_bit(checkpoint, 300)
    result = CliRunner().invoke(main, ["eval", str(checkpoint), str(bench)])
    assert result.exit_code != 0 and f"checkpoint {checkpoint} is damaged" in result.output


# ----------------------------------------------------------------------------- a full disk


def test_a_full_disk_during_a_save_stops_cleanly_and_the_previous_checkpoint_resumes(tmp_path, tiny_model_dir,
                                                                                    fault_data):
    # saves 1-4 are steps 1-2 (the step's file, then last.ckpt); save 5, step 3's file, meets a full disk
    code, out = run(train_args(tmp_path / "full", tiny_model_dir, fault_data), "enospc_save=5:4096")
    checkpoints = run_dir(tmp_path / "full") / "checkpoints"
    assert code == 2, out
    assert "Traceback" not in out
    error = [line for line in out.splitlines() if line.startswith("ggpo-train: error:")]
    assert len(error) == 1 and f"no space left to save {checkpoints}/epoch=0-step=3.ckpt: it needs about" in error[0]
    assert " MB free on that file system" in error[0]
    assert f"no checkpoint written (disk full); the previous one is {checkpoints}/last.ckpt" in out
    assert not (checkpoints / "aborted.ckpt").exists()
    assert not orphans(tmp_path)  # the temporary file is gone
    assert check_checkpoint(checkpoints / "last.ckpt").status is Integrity.VERIFIED
    assert weights(checkpoints / "last.ckpt")
    code, out = run(train_args(tmp_path / "resumed", tiny_model_dir, fault_data, "--ckpt_path",
                               str(checkpoints / "last.ckpt")))
    assert code == 0, out


@pytest.fixture()
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs mounted at tmp_path/disk (needs the right to mount; skips without)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_real_full_disk_stops_cleanly_and_the_previous_checkpoint_resumes(tmp_path, tiny_model_dir, fault_data,
                                                                           two_steps, small_tmpfs):
    size = (two_steps / "last.ckpt").stat().st_size
    # leave room for two checkpoints and a bit, so that a later save of the run meets the full disk
    free = shutil.disk_usage(small_tmpfs).free
    with open(small_tmpfs / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - int(2.5 * size) - 256 * 1024))
    code, out = run(train_args(small_tmpfs, tiny_model_dir, fault_data, "--trainer.max_steps", "8"))
    checkpoints = run_dir(small_tmpfs) / "checkpoints"
    assert code == 2, out
    assert "Traceback" not in out and "ggpo-train: error: no space left to save" in out
    assert not orphans(small_tmpfs)
    assert check_checkpoint(checkpoints / "last.ckpt").status is Integrity.VERIFIED
    code, out = run(train_args(tmp_path / "resumed", tiny_model_dir, fault_data, "--ckpt_path",
                               str(checkpoints / "last.ckpt"), "--trainer.max_steps", "8"))
    assert code == 0, out
