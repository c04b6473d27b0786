"""A third-party plugin (fixtures/plugin_pkg) is found through its entry point.

The fast test fakes the installation: it puts the package and a ``*.dist-info`` holding
its ``entry_points.txt`` on ``sys.path``, which is what ``importlib.metadata`` reads. The
slow test installs the package with pip and uses it from a fresh interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_verifiers import UnknownVerifierError, available_verifiers, get_verifier
from ggpo_verifiers.cli import verifiers_group

PLUGIN = Path(__file__).parent / "fixtures" / "plugin_pkg"
ENTRY_POINT = "tiny = tiny_verifier_plugin:SuffixVerifier"


def fake_install(site: Path, name: str, entry_points: str) -> None:
    """Write the metadata pip would write for a distribution ``name`` into ``site``."""
    dist_info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[ggpo.verifiers]\n{entry_points}\n")


def test_the_fixture_declares_the_entry_point_we_fake() -> None:
    name, target = (part.strip() for part in ENTRY_POINT.split("="))
    pyproject = (PLUGIN / "pyproject.toml").read_text()
    assert '[project.entry-points."ggpo.verifiers"]' in pyproject
    assert f'{name} = "{target}"' in pyproject


def test_plugin_is_found_by_name_and_runs_in_the_pool(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN))
    with pytest.raises(UnknownVerifierError):
        get_verifier("tiny")  # importable, but not installed: no entry point yet
    fake_install(tmp_path, "tiny-verifier-plugin", ENTRY_POINT)
    monkeypatch.syspath_prepend(str(tmp_path))

    assert available_verifiers()["tiny"] == "tiny_verifier_plugin:SuffixVerifier"
    with get_verifier("tiny", workers=1, timeout=5.0) as verifier:
        assert type(verifier).__name__ == "SuffixVerifier" and verifier.name == "tiny"
        # Scored in a worker process, which imports the plugin from the parent's sys.path.
        assert verifier.score_batch(["the end", "the start", "THE END"], ["end"] * 3) == [1.0, 0.0, 0.0]
    spec = {"class_path": "tiny", "init_args": {"ignore_case": True}}
    with get_verifier(spec, workers=1, timeout=5.0) as verifier:
        assert verifier.score("THE END", "end") == 1.0
    listing = CliRunner().invoke(verifiers_group, ["list"])
    assert listing.exit_code == 0 and "tiny_verifier_plugin:SuffixVerifier" in listing.output


def test_an_entry_point_that_is_not_a_verifier_is_rejected(tmp_path: Path, monkeypatch) -> None:
    fake_install(tmp_path, "bad-plugin", "bad = collections:OrderedDict")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match=r"entry point 'bad' \(collections:OrderedDict\)"):
        get_verifier("bad")


@pytest.mark.slow
def test_pip_installed_plugin_works_in_a_fresh_interpreter(tmp_path: Path) -> None:
    source = shutil.copytree(PLUGIN, tmp_path / "src")  # keep build debris out of the repo
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--no-build-isolation", "--target", str(site), str(source)],
        check=True,
    )  # fmt: skip
    script = (
        "from ggpo_verifiers import get_verifier\n"
        "with get_verifier('tiny', workers=1) as v:\n"
        "    print(v.score_batch(['the end', 'nope'], ['end', 'end']))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1.0, 0.0]"
