"""Packaging (issue 25, finding 8): a wheel carries the recipes and the LICENSE, `ggpo recipes` finds them from an
installed wheel, and every third-party import of the package is a declared dependency (base or extra)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ggpo_lightning.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, timeout=300)
    return next(out.glob("ggpo_lightning-*.whl"))


def test_the_wheel_carries_the_recipes_the_license_and_the_declared_metadata(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    recipes = {n.removeprefix("ggpo_lightning/recipes/") for n in names if n.startswith("ggpo_lightning/recipes/")}
    in_repo = {p.relative_to(ROOT / "recipes").as_posix() for p in (ROOT / "recipes").rglob("*.yaml")}
    assert in_repo <= recipes and "README.md" in recipes
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    for requirement in ("pyyaml>=6", "rich>=13", 'tensorboard>=2.16; extra == "tensorboard"',
                        'wandb>=0.17; extra == "wandb"'):
        assert f"Requires-Dist: {requirement}" in metadata


def test_recipes_are_found_and_copied_from_an_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    script = ("from ggpo_lightning.cli.recipes import recipe_files; import sys; "
              "files = recipe_files(); print(files['qwen3-1.7b-math']); "
              "from ggpo_lightning.cli.main import main; sys.argv = ['ggpo', 'recipes', 'copy', 'loggers/wandb']; main()")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith(str(site / "ggpo_lightning" / "recipes"))  # the wheel's copy
    assert (tmp_path / "wandb.yaml").read_text() == (ROOT / "recipes" / "loggers" / "wandb.yaml").read_text()


def test_recipes_copy_refuses_to_overwrite_and_names_unknown_recipes(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["recipes", "copy", "quickstart", str(tmp_path)]).exit_code == 0
    again = runner.invoke(main, ["recipes", "copy", "quickstart", str(tmp_path)])
    assert again.exit_code == 1 and "exists" in again.output
    unknown = runner.invoke(main, ["recipes", "copy", "qwen9", str(tmp_path)])
    assert unknown.exit_code == 2 and "no recipe 'qwen9'" in unknown.output


def test_every_third_party_import_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    declared |= {canonicalize_name(Requirement(r).name) for extra in project["optional-dependencies"].values()
                 for r in extra}
    distributions = packages_distributions()
    missing = set()
    for path in [*(ROOT / "ggpo_lightning").rglob("*.py"), *(ROOT / "verifiers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top.startswith("ggpo_"):
                    continue
                owners = {canonicalize_name(d) for d in distributions.get(top, [top])}
                if not owners & declared:
                    missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def test_the_quickstart_installs_the_package_alone_and_the_tests_the_dev_extra(wheel):
    """Issue 40: `make quickstart` installed the whole dev extra (TRL, W&B, py-spy). Now it installs the package with
    its base dependencies (no extra), `make test` the dev extra; `filelock` (the run lock) is a base dependency."""
    names = zipfile.ZipFile(wheel).namelist()
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    base = {canonicalize_name(Requirement(line.removeprefix("Requires-Dist: ")).name)
            for line in metadata.splitlines() if line.startswith("Requires-Dist: ") and "extra ==" not in line}
    assert "filelock" in base and not base & {"trl", "wandb", "py-spy", "pytest", "tensorboard", "peft"}

    def commands(target: str) -> str:
        return subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    assert "EXTRAS= bash scripts/setup-venv.sh" in commands("quickstart")
    assert "EXTRAS=dev bash scripts/setup-venv.sh" in commands("test")
