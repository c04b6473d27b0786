"""``ggpo verifiers list|check|score`` through click's test runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_verifiers.cli import verifiers_group


def invoke(*args: str):
    return CliRunner().invoke(verifiers_group, list(args))


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_list_shows_the_builtins() -> None:
    result = invoke("list")
    assert result.exit_code == 0
    assert "math" in result.output and "ggpo_verifiers.exact:NumericVerifier" in result.output


@pytest.mark.parametrize(
    ("response", "expected"),
    [("so \\boxed{0.5}", "1 (correct)"), ("so \\boxed{0.6}", "0 (wrong)"), ("no answer", "0 (unparseable)")],
)
def test_check_math(response: str, expected: str) -> None:
    result = invoke("check", "--verifier", "math", "--workers", "1", "--gold", "\\frac12", "--response", response)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == expected


def test_check_accepts_a_json_spec() -> None:
    spec = json.dumps({"class_path": "exact", "init_args": {"case_sensitive": True}})
    assert invoke("check", "-v", spec, "--gold", "Paris", "--response", "paris").output.strip() == "0 (wrong)"


def test_check_reports_bad_names_and_golds() -> None:
    result = invoke("check", "--verifier", "nope", "--gold", "1", "--response", "1")
    assert result.exit_code == 2
    assert "unknown verifier 'nope'; available: exact, math, numeric" in result.output
    result = invoke("check", "-v", "numeric", "--gold", "one", "--response", "1")
    assert result.exit_code == 2
    assert "--gold" in result.output and "unusable gold answer 'one'" in result.output


def test_score_reports_accuracy_and_stats(tmp_path: Path) -> None:
    data = write_jsonl(
        tmp_path / "rows.jsonl",
        [
            '{"response": "so \\\\boxed{2}", "gold": 2}',
            '{"response": "no idea", "gold": "3"}',
            "",
            '{"response": "The answer is 1/2.", "gold": "\\\\frac{1}{2}"}',
            '{"response": "\\\\boxed{5}", "gold": "4"}',
        ],
    )
    result = invoke("score", str(data), "--workers", "1")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "accuracy: 0.5000 (2/4)"
    assert {"correct: 2", "wrong: 1", "unparseable: 1", "timeout: 0"} <= set(lines)
    assert "unboxed: 2 (50.0% of responses have no \\boxed{} answer)" in lines
    assert not any(line.startswith("note:") for line in lines)  # half unboxed is not "most"
    as_json = json.loads(invoke("score", str(data), "-v", "exact", "--json").output)
    assert as_json["total"] == 4 and as_json["correct"] == 1  # exact: only "2" == "2"
    assert as_json["unboxed"] == 2 and as_json["unboxed_share"] == 0.5


def test_score_points_at_the_prompt_template_when_most_answers_are_unboxed(tmp_path: Path) -> None:
    data = write_jsonl(
        tmp_path / "rows.jsonl",
        ['{"response": "It is 2.", "gold": "2"}', '{"response": "x = 3", "gold": "3"}', '{"response": "\\\\boxed{4}", "gold": "4"}'],
    )
    result = invoke("score", str(data), "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "accuracy: 1.0000 (3/3)" in result.output  # unboxed answers still count
    assert "unboxed: 2 (66.7% of responses" in result.output
    assert "does the prompt template ask for one?" in result.output


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "rows.jsonl:2: not valid JSON"),
        ('{"response": "x"}', 'rows.jsonl:2: expected an object with a string "response" and a "gold"'),
        ('{"response": 1, "gold": "1"}', 'rows.jsonl:2: expected an object with a string "response"'),
        ('["x", "1"]', "rows.jsonl:2: expected an object"),
        ('{"response": "x", "gold": null}', 'rows.jsonl:2: "gold" must be a string or a number'),
        ('{"response": "x", "gold": "\\\\frac{1}{"}', "rows.jsonl:2: unusable gold answer '\\frac{1}{'"),
    ],
)
def test_score_names_the_file_and_line_of_a_bad_row(tmp_path: Path, bad_line: str, message: str) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", ['{"response": "1", "gold": "1"}', bad_line])
    result = invoke("score", str(data), "--workers", "1")
    assert result.exit_code == 1
    assert message in result.output


def test_score_rejects_an_empty_file(tmp_path: Path) -> None:
    result = invoke("score", str(write_jsonl(tmp_path / "empty.jsonl", [""])))
    assert result.exit_code == 1 and "no rows" in result.output


def test_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ggpo_verifiers", "check", "-v", "exact", "--gold", "a", "--response", "A"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 (correct)"
