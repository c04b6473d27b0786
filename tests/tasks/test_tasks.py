"""The synthetic arithmetic task: correct, reproducible problems and safely cached splits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ggpo_lightning.records.errors import FolderInUseError, SettingsError
from ggpo_lightning.tasks import ArithmeticTask, write_splits
from ggpo_lightning.tasks import arithmetic
from ggpo_lightning.records import atomic

PROBLEM = re.compile(r"(\d+)([+\-*])(\d+)=")


def read_rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_problems_are_deterministic_per_seed_and_extend_each_other():
    task = ArithmeticTask(max_operand=50, ops="+-*")
    assert task.problems(40, seed=3) == task.problems(40, seed=3)
    assert task.problems(40, seed=3) != task.problems(40, seed=4)
    assert task.problems(60, seed=3)[:40] == task.problems(40, seed=3)
    assert [r["id"] for r in task.problems(3, seed=7)] == ["arith-7-0", "arith-7-1", "arith-7-2"]
    assert task.problems(0, seed=1) == []


@pytest.mark.parametrize("ops", ["+", "-", "*", "+-*"])
def test_answers_are_the_exact_results_of_the_prompts(ops: str):
    task = ArithmeticTask(max_operand=12, ops=ops)
    rows = task.problems(300, seed=0)
    used = set()
    for row in rows:
        a, op, b = PROBLEM.fullmatch(row["prompt"]).groups()
        a, b = int(a), int(b)
        assert 0 <= a <= 12 and 0 <= b <= 12
        assert int(row["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert row["answer"] == str(int(row["answer"]))  # canonical decimal, "-3" not "- 3"
        used.add(op)
    assert used == set(ops)
    assert any(r["answer"].startswith("-") for r in rows) == ("-" in ops)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"ops": ""}, "ops"), ({"ops": "/"}, "ops"), ({"ops": "++"}, "ops"),
     ({"max_operand": 0}, "max_operand"), ({"max_operand": 2.5}, "max_operand")],
)
def test_bad_task_parameters_name_the_field(kwargs: dict, field: str):
    with pytest.raises(ValueError, match=f"ArithmeticTask.{field}"):
        ArithmeticTask(**kwargs)


def test_bad_counts_name_the_argument(tmp_path: Path):
    with pytest.raises(ValueError, match="n must be"):
        ArithmeticTask().problems(-1, seed=0)
    with pytest.raises(ValueError, match="n_test must be"):
        write_splits(ArithmeticTask(), tmp_path, n_train=4, n_test=-2, seed=0)
    # 2 ops x 4 x 4 operands = 32 distinct problems
    with pytest.raises(ValueError, match="exceeds the 32 distinct problems"):
        write_splits(ArithmeticTask(max_operand=3, ops="+-"), tmp_path, n_train=30, n_test=3, seed=0)
    assert not any(tmp_path.iterdir())


def test_splits_are_distinct_disjoint_reproducible_and_seed_dependent(tmp_path: Path):
    task = ArithmeticTask(max_operand=9, ops="+")  # 100 prompts: collisions are frequent
    train, test = write_splits(task, tmp_path / "a", n_train=80, n_test=20, seed=5)
    train_rows, test_rows = read_rows(train), read_rows(test)
    train_prompts, test_prompts = {r["prompt"] for r in train_rows}, {r["prompt"] for r in test_rows}
    assert (len(train_rows), len(test_rows)) == (80, 20)
    assert len(train_prompts) == 80 and len(test_prompts) == 20  # distinct within each split
    assert not train_prompts & test_prompts
    assert len({r["id"] for r in train_rows + test_rows}) == 100

    again = write_splits(task, tmp_path / "b", n_train=80, n_test=20, seed=5)
    assert [p.read_text() for p in again] == [train.read_text(), test.read_text()]
    other = write_splits(task, tmp_path / "c", n_train=80, n_test=20, seed=6)
    assert other[1].read_text() != test.read_text()


def test_existing_splits_with_same_parameters_are_reused_without_writing(tmp_path, monkeypatch):
    task = ArithmeticTask()
    first = write_splits(task, tmp_path, n_train=50, n_test=10, seed=0)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}

    def no_write(path, text):
        raise AssertionError(f"rewrote {path}")

    monkeypatch.setattr(arithmetic, "atomic_write_text", no_write)
    assert write_splits(task, tmp_path, n_train=50, n_test=10, seed=0) == first
    assert {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps


def test_existing_splits_with_other_parameters_raise(tmp_path: Path):
    write_splits(ArithmeticTask(), tmp_path, n_train=50, n_test=10, seed=0)
    with pytest.raises(SettingsError, match=r"n_train: recorded 50, requested 60.*Delete"):
        write_splits(ArithmeticTask(), tmp_path, n_train=60, n_test=10, seed=0)
    with pytest.raises(SettingsError, match="'ops': '\\+-'"):
        write_splits(ArithmeticTask(ops="+-"), tmp_path, n_train=50, n_test=10, seed=0)


def test_foreign_split_files_are_not_overwritten(tmp_path: Path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "mine"}\n')
    with pytest.raises(FolderInUseError, match="no task.json"):
        write_splits(ArithmeticTask(), tmp_path, n_train=5, n_test=5, seed=0)
    assert (tmp_path / "train.jsonl").read_text() == '{"prompt": "mine"}\n'


def test_interrupted_write_leaves_no_partial_file_and_a_rerun_completes(tmp_path, monkeypatch):
    real_replace = atomic.os.replace

    def crash_on_test_file(src, dst):
        if Path(dst).name == "test.jsonl":
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", crash_on_test_file)
    with pytest.raises(KeyboardInterrupt):
        write_splits(ArithmeticTask(), tmp_path, n_train=20, n_test=10, seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task.json", "train.jsonl"]  # no temp files

    monkeypatch.setattr(atomic.os, "replace", real_replace)
    train, test = write_splits(ArithmeticTask(), tmp_path, n_train=20, n_test=10, seed=0)
    assert len(read_rows(train)) == 20 and len(read_rows(test)) == 10


def test_task_module_does_not_import_torch():
    code = "import sys, ggpo_lightning.tasks.arithmetic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
