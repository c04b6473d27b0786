"""Small local files in the standard math layouts (MATH / MATH-500, GSM8K), made in the tests: nothing is
downloaded."""

from __future__ import annotations


def math_records(n: int = 20) -> list[dict]:
    """MATH / MATH-500 rows: every fifth with an ``answer`` field, one without any box."""
    rows = [{"problem": f"What is {i} + {i}?", "solution": f"Add: $\\boxed{{{2 * i}}}$.", "level": "Level 1",
             "type": "Algebra"} for i in range(n)]
    for i in range(0, n, 5):
        rows[i]["answer"] = str(2 * i)
    if n > 3:
        rows[3]["solution"] = "no box here"
    return rows


def gsm8k_records(n: int = 20) -> list[dict]:
    return [{"question": f"Tom has {i} apples and buys {i}. How many?",
             "answer": f"{i}+{i}=<<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i:,}"} for i in range(n)]
