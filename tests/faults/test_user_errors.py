"""User mistakes end in one readable error, no traceback: ``ggpo-train: error: <message>``, the ``--debug`` hint and
exit status 2; ``--debug`` or ``GGPO_DEBUG=1`` show the traceback; a genuine bug keeps its traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from faultkit import run, run_dir, train_args
from ggpo_lightning.cli.errors import USER_ERROR_EXIT, report_user_errors
from ggpo_lightning.cli.main import _UserErrorGroup
from ggpo_lightning.records.errors import DataError


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, tiny_model_dir, fault_data) -> Path:
    """The checkpoint folder of a 1-step ``ggpo-train`` run."""
    root = tmp_path_factory.mktemp("one-step")
    code, out = run(train_args(root, tiny_model_dir, fault_data, "--trainer.max_steps", "1"))
    assert code == 0, out
    return run_dir(root) / "checkpoints"


def assert_user_error(code: int, out: str, message: str) -> None:
    assert code == USER_ERROR_EXIT, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("ggpo-train: error:")]
    assert len(errors) == 1, out
    assert message in out[out.index(errors[0]):], out
    assert "run with --debug or GGPO_DEBUG=1 for the traceback" in out


def test_a_non_utf8_row(tmp_path, tiny_model_dir, fault_data):
    bad = tmp_path / "train.jsonl"
    bad.write_bytes(b'{"prompt": "1+2=", "answer": "3"}\n{"prompt": "2+\xff=", "answer": "2"}\n')
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--data.train_path", str(bad)))
    assert_user_error(code, out, f"ggpo-train: error: {bad}:2: not UTF-8 (byte 0xff at column 15)")


def test_a_prompt_longer_than_the_context(tmp_path, tiny_model_dir, fault_data):
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"prompt": "1+" * 40 + "=", "answer": "3"}) + "\n")
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--data.train_path", str(bad)))
    assert_user_error(code, out, f"ggpo-train: error: {bad}:1: the prompt is")


def test_an_unknown_verifier_name(tmp_path, tiny_model_dir, fault_data):
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier", "no_such_verifier"))
    assert_user_error(code, out, "model.verifier: unknown verifier 'no_such_verifier'")


def test_a_truncated_checkpoint(tmp_path, tiny_model_dir, fault_data, one_step):
    folder = tmp_path / "checkpoints"
    shutil.copytree(one_step, folder)
    (folder / "last.ckpt").write_bytes((folder / "last.ckpt").read_bytes()[:1000])
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--ckpt_path", str(folder / "last.ckpt")))
    assert_user_error(code, out, f"ggpo-train: error: checkpoint {folder}/last.ckpt is corrupt")


def test_a_resume_with_changed_data(tmp_path, tiny_model_dir, fault_data, one_step):
    shorter = tmp_path / "train.jsonl"
    shorter.write_text("".join((fault_data / "train.jsonl").read_text().splitlines(keepends=True)[:12]))
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--ckpt_path", str(one_step / "last.ckpt"),
                               "--data.train_path", str(shorter)))
    assert_user_error(code, out, "ggpo-train: error: the checkpoint was written by a different run:")
    assert "training data rows: checkpoint 24, now 12" in out


@pytest.mark.parametrize("how", ["--debug", "GGPO_DEBUG=1"])
def test_debug_shows_the_traceback(tmp_path, tiny_model_dir, fault_data, how, monkeypatch):
    extra = ["--debug"] if how == "--debug" else []
    if how == "GGPO_DEBUG=1":
        monkeypatch.setenv("GGPO_DEBUG", "1")  # the child inherits it
    code, out = run(train_args(tmp_path, tiny_model_dir, fault_data, "--model.verifier", "no_such_verifier", *extra))
    assert code != 0 and "Traceback" in out and "SettingsError: invalid configuration" in out, out


def test_a_bug_keeps_its_traceback_and_a_user_error_exits_2():
    def bug():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        report_user_errors("ggpo-train", bug, debug=False)
    with pytest.raises(SystemExit) as stop:
        report_user_errors("ggpo-train", lambda: (_ for _ in ()).throw(DataError("bad row")), debug=False)
    assert stop.value.code == USER_ERROR_EXIT


def test_the_ggpo_group_prints_a_user_error_without_a_traceback():
    @click.group(cls=_UserErrorGroup)
    @click.option("--debug", is_flag=True)
    def group(debug: bool) -> None:
        pass

    @group.command()
    def convert() -> None:
        raise DataError("data.jsonl:3: not valid JSON")

    result = CliRunner().invoke(group, ["convert"])
    assert result.exit_code == USER_ERROR_EXIT
    assert "ggpo: error: data.jsonl:3: not valid JSON" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(group, ["--debug", "convert"])
    assert isinstance(result.exception, DataError)  # propagates, with its traceback


def test_the_module_form_exits_as_the_console_script(tmp_path):
    """``python -m ggpo_lightning.cli.train`` (the form torchrun and ``ggpo sweep`` start) and the ``ggpo-train``
    script: the same one-line user error and exit status 2, and 0 for a valid ``--print_config``."""
    script = Path(sys.executable).with_name("ggpo-train")
    assert script.exists(), f"the console script is not installed beside {sys.executable}"
    module = (sys.executable, "-m", "ggpo_lightning.cli.train")
    recipe = ["--config", str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"), "--print_config"]
    bad = [*recipe, "--model.objective.beta", "-0.1"]
    commands = {"script": [str(script), *bad], "module": [*module, *bad], "valid": [*module, *recipe]}
    started = {name: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd=tmp_path) for name, command in commands.items()}  # side by side: 3 imports
    results = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=300)
        results[name] = (proc.returncode, out, err)
    for name in ("script", "module"):
        code, _, err = results[name]
        assert code == USER_ERROR_EXIT and "Traceback" not in err, (name, err)
        assert "model.objective.beta must be a finite number > 0, got -0.1" in err, (name, err)
    assert results["module"][2] == results["script"][2]
    code, out, err = results["valid"]
    assert code == 0 and "objective" in out, err
    assert "not recommended to provide both args and command line arguments" not in err  # LightningCLI's warning
