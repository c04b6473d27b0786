"""The one prompt schema: gold extraction, the layouts (MATH, GSM8K, prompt-answer, verl) and their conversion."""

from __future__ import annotations

import pytest

from ggpo_lightning.records.errors import DataError
from ggpo_lightning.records.formats import convert_records, detect_format, to_schema
from ggpo_verifiers import get_verifier


@pytest.mark.parametrize("solution,gold", [
    ("We add: $\\boxed{2}$.", "2"),
    ("It is \\fbox{7}", "7"),
    ("So the answer is \\boxed 5.", "5"),
    ("nested \\boxed{\\sqrt{\\frac{a}{b}}} done", "\\sqrt{\\frac{a}{b}}"),
    ("first \\boxed{1}. Finally \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # several boxes: the last
])
def test_a_math_rows_gold_is_what_its_solution_marks(solution, gold):
    """The layouts take the verifier's one extraction (its cases: tests/verifiers/test_answers_and_golds.py)."""
    assert to_schema({"problem": "p", "solution": solution}, "math", "f:1")["answer"] == gold


def test_each_layout_becomes_the_schema_keeping_the_other_fields():
    math = to_schema({"problem": "p", "solution": "s \\boxed{3}", "level": "Level 2"}, "math", "f:1")
    assert math == {"prompt": "p", "answer": "3", "solution": "s \\boxed{3}", "level": "Level 2"}
    given = to_schema({"problem": "p", "solution": "\\boxed{4}", "answer": "3"}, "math", "f:1")
    assert given["answer"] == "3"  # MATH-500's answer field is the gold when present
    gsm = to_schema({"question": "q", "answer": "work\n#### 72"}, "gsm8k", "f:1")
    assert gsm == {"prompt": "q", "answer": "72", "solution": "work\n#### 72"}
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Solve 1+1."}]
    verl = to_schema({"data_source": "dapo", "prompt": messages, "reward_model": {"ground_truth": "2",
                                                                                "style": "rule"}}, "verl", "f:1")
    assert verl == {"prompt": "Solve 1+1.", "answer": "2", "data_source": "dapo", "messages": messages,
                    "reward_model": {"ground_truth": "2", "style": "rule"}}
    plain = to_schema({"text": "t", "final": " 9 "}, "prompt-answer", "f:1", prompt_field="text", answer_field="final")
    assert plain == {"prompt": "t", "answer": "9"}


@pytest.mark.parametrize("record,format,message", [
    ({"problem": "p", "solution": "it is 3"}, "math", r"f:7: field 'solution' gives no gold: the solution marks no "
                                                      r"final answer"),
    ({"problem": "p", "solution": "\\boxed{3"}, "math", r"f:7: field 'solution' gives no gold: .* never closed"),
    ({"problem": "p"}, "math", r"f:7: missing field 'answer' .*fields: problem"),
    ({"question": "q", "answer": "72"}, "gsm8k", r"f:7: field 'answer' gives no gold: the solution marks no final answer"),
    ({"prompt": "just text", "reward_model": {"ground_truth": "1"}}, "verl", r"f:7: verl layout: 'prompt' must be"),
    ({"prompt": [{"role": "user", "content": "x"}]}, "verl", r"f:7: verl layout: no reward_model.ground_truth"),
    ({"prompt": "  ", "answer": "1"}, "prompt-answer", r"f:7: the prompt is empty"),
    ({"prompt": "p", "answer": "1"}, "alpaca", r"unknown data format 'alpaca'; choose one of prompt-answer"),
])
def test_unusable_rows_are_data_errors_naming_the_line(record, format, message):
    with pytest.raises(DataError, match=message):
        to_schema(record, format, "f:7")


def test_detect_format_guesses_the_standard_layouts():
    assert detect_format({"problem": "p", "solution": "s", "answer": "a"}) == "math"
    assert detect_format({"problem": "p", "solution": "s"}) == "math"
    assert detect_format({"question": "q", "answer": "w\n#### 1"}) == "gsm8k"
    assert detect_format({"prompt": [{"role": "user", "content": "x"}], "reward_model": {}}) == "verl"
    assert detect_format({"question": "q", "answer": "1"}) is None  # plain prompt-answer with other names
    assert detect_format({"prompt": "p", "answer": "1"}) is None


def test_convert_records_leaves_out_rows_without_a_usable_gold_and_reports_each_by_line():
    records = [("in.jsonl:1", {"problem": "a", "solution": "\\boxed{1}"}),
               ("in.jsonl:2", {"problem": "b", "solution": "none"}),  # no box
               ("in.jsonl:3", {"problem": "c", "solution": "\\boxed{\\frac{1}{}}"}),  # the verifier refuses it
               ("in.jsonl:4", {"problem": "d", "solution": "\\boxed{x^2}"}),
               ("in.jsonl:5", {"problem": "e", "answer": "\\frac{"})]  # refused too
    with get_verifier("math", workers=1) as verifier:
        rows, left_out = convert_records(records, "math", verifier)
    assert [r["prompt"] for r in rows] == ["a", "d"]
    assert [m.split(": ", 1)[0] for m in left_out] == ["in.jsonl:2", "in.jsonl:3", "in.jsonl:5"]
    assert "marks no final answer" in left_out[0] and "\\frac{1}{}" in left_out[1]
