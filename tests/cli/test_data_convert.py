"""``ggpo data convert`` and the one schema: MATH, GSM8K and verl files in, rows that training and ``ggpo eval``
read alike out (issue 25, finding 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_lightning.cli.main import main
from ggpo_lightning.evaluation.accuracy import load_benchmark
from ggpo_lightning.records.prompts import load_prompt_rows
from ggpo_lightning.training.data import PromptGroupDataModule
from first_run_data import gsm8k_records, math_records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def convert(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["data", "convert", *args])
    return result.exit_code, result.stdout, result.stderr


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_convert_math_writes_the_schema_and_reports_the_row_without_a_gold(tmp_path):
    source = write_jsonl(tmp_path / "math.jsonl", math_records())
    code, out, err = convert("--format", "math", str(source), str(tmp_path / "out" / "train.jsonl"))
    assert code == 0, err
    rows = read(tmp_path / "out" / "train.jsonl")
    assert len(rows) == 19 and "19 rows written" in out and "1 left out" in out
    assert f"left out: {source}:4: field 'solution' gives no gold: the solution marks no final answer" in err
    assert rows[0] == {"prompt": "What is 0 + 0?", "answer": "0", "solution": "Add: $\\boxed{0}$.",
                       "level": "Level 1", "type": "Algebra"}
    assert [r["answer"] for r in rows[:4]] == ["0", "2", "4", "8"]


def test_convert_gsm8k_from_parquet_and_training_and_eval_read_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(gsm8k_records()), source)
    out = tmp_path / "gsm8k.jsonl"
    code, _, err = convert("--format", "gsm8k", str(source), str(out))
    assert code == 0, err
    assert read(out)[19]["answer"] == "38" and read(out)[12]["answer"] == "24"
    trained = load_prompt_rows(out)  # training's defaults: prompt / answer
    assert load_benchmark(out) == trained  # eval reads the same schema the same way
    assert trained[19].gold == "38" and trained[19].prompt.startswith("Tom has 19 apples")


def test_convert_verl_from_a_save_to_disk_folder_keeps_the_messages(tmp_path):
    import datasets

    messages = [{"role": "user", "content": "Solve 2+2. Put the answer after 'Answer:'."}]
    rows = [{"data_source": "math_dapo", "prompt": messages, "ability": "MATH",
             "reward_model": {"ground_truth": "4", "style": "rule"}, "extra_info": {"index": "a"}}] * 3
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(tmp_path / "dapo")
    code, _, err = convert("--format", "verl", str(tmp_path / "dapo"), str(tmp_path / "dapo.jsonl"))
    assert code == 0, err
    converted = read(tmp_path / "dapo.jsonl")
    assert converted[0]["prompt"] == messages[0]["content"] and converted[0]["answer"] == "4"
    assert converted[0]["messages"] == messages and converted[0]["data_source"] == "math_dapo"
    code, _, err = convert("--format", "verl", "--split", "test", str(tmp_path / "dapo"), str(tmp_path / "x.jsonl"))
    assert code == 1 and "no split 'test' (splits: train)" in err


def test_convert_refuses_a_file_where_no_row_fits_the_format(tmp_path):
    source = write_jsonl(tmp_path / "math.jsonl", math_records(3))
    code, _, err = convert("--format", "gsm8k", str(source), str(tmp_path / "out.jsonl"))
    assert code == 1 and "no row has a usable prompt and gold (3 left out); is --format right?" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_eval_reads_a_raw_gsm8k_file(tmp_path):
    """Finding 3: a GSM8K answer (``... #### 72``) was refused by ``ggpo eval``."""
    source = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_records(3))
    assert [r.gold for r in load_benchmark(source)] == ["0", "2", "4"]


def test_data_format_presets_read_raw_files_in_training(tmp_path):
    source = write_jsonl(tmp_path / "math.jsonl", math_records(3))
    datamodule = PromptGroupDataModule(train_path=str(source), format="math")
    datamodule.load_rows()
    assert [r.gold for r in datamodule.train_rows] == ["0", "2", "4"]
    with pytest.raises(ValueError, match="data.format must be one of prompt-answer, math, gsm8k, verl, got 'MATH'"):
        PromptGroupDataModule(train_path=str(source), format="MATH")


def test_a_missing_val_path_is_named(tmp_path):
    """Finding 2: ``--data.train_path math.jsonl`` kept a default val_path, and the message did not name it."""
    source = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "p", "answer": "1"}])
    datamodule = PromptGroupDataModule(train_path=str(source), val_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"data.val_path .*nope.jsonl does not exist.*--data.val_path null"):
        datamodule.load_rows()
