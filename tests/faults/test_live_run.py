"""A second ``ggpo-train`` into the run directory a live ``ggpo-train`` is writing: one line naming the live
process's pid, exit status 2, and nothing of the live run changed, even though the folder already holds a run's
files (the lock is checked before what the folder holds)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

from faultkit import run, run_dir, start, train_args
from ggpo_lightning.cli.errors import USER_ERROR_EXIT


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (and its lock file beside it) with the SHA-256 of its bytes."""
    files = [*directory.rglob("*"), directory.parent / f".{directory.name}.lock"]
    return {p.relative_to(directory.parent).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in files if p.is_file()}


def wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the first run ended early: {proc.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, f"no {path} after {seconds} s"
        time.sleep(0.5)


def test_a_second_run_into_a_live_runs_directory_names_the_live_pid_and_changes_nothing(tmp_path, tiny_model_dir,
                                                                                         fault_data):
    live = start(train_args(tmp_path, tiny_model_dir, fault_data, "--trainer.max_steps", "100000",
                            "--checkpoint.every_n_train_steps", "2"))
    directory = run_dir(tmp_path)
    try:
        wait_for(directory / "checkpoints" / "last.ckpt", live, seconds=300)  # it has trained and saved
        os.kill(live.pid, signal.SIGSTOP)  # frozen, lock held: the folder cannot change while the second one runs
        before = snapshot(directory)
        assert {"version_0/config.yaml", "version_0/metrics.csv", ".version_0.lock"} <= set(before), before
        code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--trainer.logger.init_args.version", "0"),
                        timeout=300)
        after = snapshot(directory)
    finally:
        os.kill(live.pid, signal.SIGCONT)
        live.send_signal(signal.SIGTERM)
        try:
            live.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            live.kill()
            live.communicate()
    assert code == USER_ERROR_EXIT, out
    errors = [line for line in out.splitlines() if line.startswith("ggpo-train: error:")]
    assert errors == [line for line in errors if f"in use by another ggpo-train (pid {live.pid}," in line], out
    assert len(errors) == 1 and "Traceback" not in out, out
    assert "holds an earlier run" not in out
    assert after == before  # not a byte of the live run's files, nor its lock file, changed
