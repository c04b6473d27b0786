"""Prompt files and datasets, bad rows, and the DataModule's prompt order."""

from __future__ import annotations

import json

import pytest

from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.records.prompts import load_dataset_rows, load_prompt_rows


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_rows_carry_id_prompt_gold_and_their_source(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": 7, "problem": "1+1", "answer": 2}, "",
                                              {"problem": "2+2", "answer": "4"}])
    rows = load_prompt_rows(path, prompt_field="problem", template="Q: {prompt}\nA:")
    assert [(r.id, r.prompt, r.gold, r.source) for r in rows] == [
        ("7", "Q: 1+1\nA:", "2", f"{path}:1"),
        ("p.jsonl:3", "Q: 2+2\nA:", "4", f"{path}:3"),  # blank line 2 skipped, numbering kept
    ]


@pytest.mark.parametrize("line,message", [
    ({"prompt": "1+1"}, "missing field 'answer' (fields: prompt)"),
    ({"answer": "2"}, "missing field 'prompt'"),
    ({"prompt": "1+1", "answer": None}, "missing field 'answer'"),
    ('{"prompt": "1+1", "answer": ', "not valid JSON"),
    ('["1+1", "2"]', "expected a JSON object"),
])
def test_a_bad_row_is_an_error_naming_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "0+0", "answer": "0"}, line])
    with pytest.raises(ValueError) as err:
        load_prompt_rows(path)
    assert f"{path}:2" in str(err.value) and message in str(err.value)


def test_template_naming_a_field_the_row_lacks(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1", "answer": "2"}])
    with pytest.raises(ValueError, match=rf"{path}:1: data.prompt_template names field 'topic'"):
        load_prompt_rows(path, template="{topic}: {prompt}")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompt_rows(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="no prompts found"):
        load_prompt_rows(write_jsonl(tmp_path / "empty.jsonl", [""]))


def test_parquet_rows_match_jsonl_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    records = [{"id": "a", "prompt": "1+1", "answer": "2"}, {"id": "b", "prompt": "2+3", "answer": "5"}]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "p.parquet")
    rows = load_prompt_rows(tmp_path / "p.parquet")
    assert [(r.id, r.prompt, r.gold) for r in rows] == [("a", "1+1", "2"), ("b", "2+3", "5")]
    assert rows[1].source == f"{tmp_path / 'p.parquet'}:2"


def test_a_local_datasets_folder_with_splits(tmp_path):
    pytest.importorskip("datasets")
    write_jsonl(tmp_path / "train.jsonl", [{"problem": f"{i}+1", "answer": str(i + 1)} for i in range(5)])
    write_jsonl(tmp_path / "test.jsonl", [{"problem": "9+9", "answer": "18"}, {"problem": "9+8"}])
    rows = load_dataset_rows(str(tmp_path), "train", prompt_field="problem")
    assert [r.gold for r in rows] == ["1", "2", "3", "4", "5"]
    with pytest.raises(ValueError, match=r"\[test\]:1: missing field 'answer'"):
        load_dataset_rows(str(tmp_path), "test", prompt_field="problem")


def test_datamodule_setting_errors_are_collected():
    with pytest.raises(ValueError) as err:
        PromptGroupDataModule(mode="replay", prompts_per_step=0, buffer_path="b.jsonl")
    message = str(err.value)
    for fragment in ("data.train_path", "data.mode", "data.prompts_per_step", "data.buffer_path"):
        assert fragment in message
    with pytest.raises(ValueError, match="exactly one of"):
        PromptGroupDataModule(train_path="t.jsonl", dataset="gsm8k")


def test_prompt_order_covers_every_prompt_once_per_pass(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"{i}+0", "answer": str(i)} for i in range(10)])
    dm = PromptGroupDataModule(str(path), prompts_per_step=3, seed=1)
    dm.setup("fit")
    drawn = [r.id for r in dm.next_prompts(20)]
    assert sorted(drawn[:10]) == sorted(drawn[10:]) == sorted(r.id for r in dm.train_rows)
    assert drawn[:10] != drawn[10:]  # reshuffled per pass
    again = PromptGroupDataModule(str(path), prompts_per_step=3, seed=1)
    again.setup("fit")
    assert [r.id for r in again.next_prompts(20)] == drawn  # the order is a function of the seed
