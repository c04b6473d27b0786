"""The configuration reference (ggpo_lightning/cli/config_reference.py, a page of the documentation site) against
the code: every key has a meaning, every key of the quickstart's resolved recipe is listed, and the hand-written
pages name only keys that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ggpo_lightning.cli.config_reference import OWN_GROUPS, config_keys, reference_markdown
from ggpo_lightning.cli.recipe_keys import MOVED_KEYS, RENAMED_KEYS

ROOT = Path(__file__).resolve().parents[2]
HAND_WRITTEN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

KEY_NAME = re.compile(r"(?<![\w./-])((?:model|data|trainer|checkpoint|summary|samples|tiny_model|synthetic_data)"
                      r"(?:\.[a-z_][a-z0-9_]*)+)")
"""A dotted name that starts with a recipe group: a key, or one of the look-alikes below."""
NOT_KEYS = {"model.generate", "trainer.callback_metrics"}
"""Python attributes the pages name (transformers' ``generate``, Lightning's ``callback_metrics``), not keys."""
FILE_SUFFIXES = (".py", ".md", ".json", ".jsonl", ".yaml", ".ckpt")


@pytest.fixture(scope="module")
def keys():
    return config_keys()


def unknown_keys(text: str, keys) -> list[str]:
    """The dotted key names in ``text`` that no recipe accepts: not a key, not a group of keys, not under a key
    whose value names a class (its ``init_args``) or is a free dict, not a retired key the trainer names."""
    known = {k.key for k in keys}
    opened = tuple(k.key + "." for k in keys if k.takes_class or k.type.startswith("dict"))
    found = []
    for match in KEY_NAME.finditer(text):
        name = match[1]
        if (name in known or name.startswith(opened) or any(k.startswith(name + ".") for k in known)
                or name in RENAMED_KEYS or name in MOVED_KEYS or name in NOT_KEYS or name.endswith(FILE_SUFFIXES)):
            continue
        found.append(name)
    return found


def test_every_key_of_the_packages_own_sections_says_what_it_means(keys):
    undocumented = [k.key for k in keys if k.group in OWN_GROUPS and not k.doc]
    assert not undocumented, f"keys without a docstring (add one to the field or the Args: section): {undocumented}"
    assert {"model.rollout.sync_every", "model.objective.beta", "data.prompts_per_step", "tiny_model.sft_steps",
            "samples.every_n_steps", "memory_check"} <= {k.key for k in keys}


def test_a_settings_dataclass_field_brings_its_attribute_docstring(keys):
    by_key = {k.key: k for k in keys}
    sync_every = by_key["model.rollout.sync_every"]
    assert sync_every.type == "int" and sync_every.default == 1
    assert sync_every.doc.startswith("Copy the learner into the rollout engine every N optimizer updates")
    # a union of settings classes opens both: the reasoning recipe's synth_math fields beside arithmetic's
    assert {"synthetic_data.task.max_operand", "synthetic_data.task.families"} <= set(by_key)
    assert by_key["trainer.logger"].takes_class and by_key["model.optimizer"].takes_class


def flatten(tree, prefix=""):
    """``{"a": {"b": 1}}`` -> ``["a.b"]``: the leaves of a resolved recipe (a ``class_path`` value ends a key)."""
    if isinstance(tree, dict) and tree and "class_path" not in tree:
        return [leaf for k, v in tree.items() for leaf in flatten(v, f"{prefix}{k}.")]
    return [prefix[:-1]]


def test_the_reference_lists_every_key_of_the_quickstarts_print_config(keys):
    out = subprocess.run([sys.executable, "-m", "ggpo_lightning.cli.train", "--config", "recipes/quickstart.yaml",
                          "--print_config"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    printed = flatten(yaml.safe_load(out))
    assert len(printed) > 100 and "model.rollout.sync_every" in printed and "tiny_model.task.max_operand" in printed
    page = reference_markdown()
    listed = {k.key for k in keys}
    missing = [key for key in printed if key not in listed or f"| `{key}` |" not in page]
    assert not missing, f"--print_config keys missing from the configuration reference: {missing}"


def test_the_hand_written_pages_name_only_keys_that_exist(keys):
    wrong = {page.relative_to(ROOT).as_posix(): unknown_keys(page.read_text(encoding="utf-8"), keys)
             for page in HAND_WRITTEN}
    assert not {page: names for page, names in wrong.items() if names}


def test_the_key_check_catches_a_misspelt_or_removed_key(keys):
    text = ("set `model.rollout.sync_evry: 4` and `data.prompts_per_stepp`; `model.rollout.sync_every`, "
            "`trainer.logger.init_args.version`, `model.rollout.vllm_placement` (retired, named by the error), "
            "`model.rollout` and `runs/data.jsonl` are fine")
    assert unknown_keys(text, keys) == ["model.rollout.sync_evry", "data.prompts_per_stepp"]
