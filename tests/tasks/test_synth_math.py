"""The synthetic math benchmark: reproducible, distinct, disjoint, and graded right by the math verifier."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from math import gcd
from pathlib import Path

import pytest
import sympy
from click.testing import CliRunner

from ggpo_lightning.cli.main import main
from ggpo_lightning.tasks import SynthMathConfig, SynthMathTask, generate_synth_splits, write_synth_splits
from ggpo_lightning.tasks.synth_math import FAMILIES, LEVELS
from ggpo_verifiers import get_verifier

# Every gold is an integer or a reduced fraction, as sympy.latex writes them.
INTEGER = re.compile(r"-?\d+")
FRACTION = re.compile(r"(- )?\\frac\{(\d+)\}\{(\d+)\}")
SAMPLE_PER_CELL = 20


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def other_forms(gold: str) -> tuple[str, str]:
    """``(equal, wrong)``: the gold in another notation, and the gold with its value changed."""
    if INTEGER.fullmatch(gold):
        return f"{gold}.0", str(int(gold) + 1)
    sign, numerator, denominator = FRACTION.fullmatch(gold).groups()
    sign = "-" if sign else ""
    return f"{sign}{numerator}/{denominator}", f"{sign}\\frac{{{int(numerator) + 1}}}{{{denominator}}}"


@pytest.fixture(scope="module")
def verifier():
    verifier = get_verifier("math", workers=2)
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    """The test split of a config with SAMPLE_PER_CELL rows in every family/level cell."""
    config = SynthMathConfig(n_train=1, n_test=SAMPLE_PER_CELL * len(FAMILIES) * len(LEVELS), seed=11)
    return generate_synth_splits(config)[1]


def test_every_family_and_level_gives_well_formed_rows(sample: list[dict]):
    by_cell: dict[tuple[str, int], list[dict]] = {}
    for row in sample:
        assert set(row) == {"id", "problem", "answer", "family", "level"}
        by_cell.setdefault((row["family"], row["level"]), []).append(row)
    assert {cell: len(rows) for cell, rows in by_cell.items()} == {
        (family, level): SAMPLE_PER_CELL for family in FAMILIES for level in LEVELS
    }
    for (family, level), rows in by_cell.items():
        assert [row["id"] for row in rows] == [f"synth-{family}-L{level}-11-{i}" for i in range(SAMPLE_PER_CELL)]
        for row in rows:
            assert INTEGER.fullmatch(row["answer"]) or FRACTION.fullmatch(row["answer"]), row
            match = FRACTION.fullmatch(row["answer"])
            if match:  # reduced, and a true fraction
                numerator, denominator = int(match[2]), int(match[3])
                assert denominator > 1 and gcd(numerator, denominator) == 1, row
    # The families are not trivial: answers vary, and fraction families give fractions.
    for family in FAMILIES:
        answers = [row["answer"] for row in sample if row["family"] == family]
        assert len(set(answers)) > len(answers) // 3, family
    for family in ("fractions", "linear"):
        assert any(FRACTION.fullmatch(row["answer"]) for row in sample if row["family"] == family)


def test_golds_are_valid_and_graded_right_by_the_math_verifier(sample: list[dict], verifier):
    golds = [row["answer"] for row in sample]
    verifier.validate_golds(golds)
    responses, expected_golds, expected = [], [], []
    for gold in golds:
        equal, wrong = other_forms(gold)
        for answer, score in ((gold, 1.0), (equal, 1.0), (wrong, 0.0)):
            responses.append(f"The answer is $\\boxed{{{answer}}}$.")
            expected_golds.append(gold)
            expected.append(score)
    scores = verifier.score_batch(responses, expected_golds)
    wrongly_graded = [(r, g) for r, g, s, e in zip(responses, expected_golds, scores, expected) if s != e]
    assert not wrongly_graded
    stats = verifier.stats
    assert (stats.correct, stats.wrong) == (2 * len(golds), len(golds))
    assert stats.timeout == stats.crashed == stats.bad_gold == stats.unparseable == 0


def test_answers_are_the_values_of_the_problems():
    # Spot checks against arithmetic done here, independently of sympy.
    train = generate_synth_splits(SynthMathConfig(n_train=150, n_test=1, seed=5))[0]

    def value(answer: str) -> Fraction:
        if INTEGER.fullmatch(answer):
            return Fraction(int(answer))
        sign, numerator, denominator = FRACTION.fullmatch(answer).groups()
        return Fraction(int(numerator), int(denominator)) * (-1 if sign else 1)

    checked = set()
    for row in train:
        problem, answer = row["problem"], value(row["answer"])
        if row["family"] == "gcd":
            numbers = [int(n) for n in re.findall(r"\d+", problem)]
            assert answer == gcd(*numbers)
        elif row["family"] == "linear" and row["level"] in (1, 2):
            a, b, c = (int(v.replace(" ", "")) for v in re.fullmatch(
                r"Solve \$(\d+) x(?: ([+-] \d+))? = (-?\d+)\$.*", problem).groups(default="0"))
            assert a * answer + b == c
        elif row["family"] == "fractions" and row["level"] == 1:
            a, b, c, d = map(int, re.fullmatch(r"Compute \$\\frac\{(\d+)\}\{(\d+)\} \+ \\frac\{(\d+)\}\{(\d+)\}\$.*",
                                               problem).groups())
            assert answer == Fraction(a, b) + Fraction(c, d)
        elif row["family"] == "arithmetic" and row["level"] == 1:
            a, op, b = re.fullmatch(r"Compute \$(\d+) ([+-]) (\d+)\$\.", problem).groups()
            assert answer == (int(a) + int(b) if op == "+" else int(a) - int(b))
        elif row["family"] == "columns":
            a, op, b = re.fullmatch(r"Compute \$(\d+) ([+-]) (\d+)\$ column by column\.", problem).groups()
            assert len(a) == len(b) == row["level"] + 1
            assert answer == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        else:
            continue
        checked.add((row["family"], row["level"]))
    assert checked == {("gcd", 1), ("gcd", 2), ("gcd", 3), ("linear", 1), ("linear", 2), ("fractions", 1),
                       ("arithmetic", 1), ("columns", 1), ("columns", 2), ("columns", 3)}


def test_same_seed_gives_identical_files_and_another_seed_other_problems(tmp_path: Path):
    config = SynthMathConfig(families=("fractions", "linear"), levels=(1, 3), n_train=60, n_test=20, seed=3)
    first = write_synth_splits(config, tmp_path / "a")
    second = write_synth_splits(config, tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    third = write_synth_splits(SynthMathConfig(**{**config.__dict__, "seed": 4}), tmp_path / "c")
    problems = {row["problem"] for path in first for row in read_rows(path)}
    other = {row["problem"] for path in third for row in read_rows(path)}
    assert len(problems & other) < len(problems) // 4


def test_rows_do_not_depend_on_the_process():
    # String hashing is salted per process; the generators must not depend on it.
    code = ("import json; from ggpo_lightning.tasks import SynthMathConfig, generate_synth_splits; "
            "print(json.dumps(generate_synth_splits(SynthMathConfig(n_train=45, n_test=15, seed=9))))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert json.loads(out) == list(generate_synth_splits(SynthMathConfig(n_train=45, n_test=15, seed=9)))


def test_prompts_are_distinct_and_splits_disjoint():
    # Enough rows that cells draw repeats and that levels of one family draw the same
    # problem (linear and gcd levels 1 and 2 overlap).
    config = SynthMathConfig(families=tuple(FAMILIES), levels=LEVELS, n_train=3000, n_test=600, seed=1)
    train, test = generate_synth_splits(config)
    assert (len(train), len(test)) == (3000, 600)
    prompts = [row["problem"] for row in train + test]
    assert len(set(prompts)) == len(prompts)
    ids = [row["id"] for row in train + test]
    assert len(set(ids)) == len(ids)
    # The test split does not depend on the size of the train split.
    assert generate_synth_splits(SynthMathConfig(n_train=10, n_test=600, seed=1))[1] == test


def test_splits_are_reused_with_the_same_parameters_and_refused_with_others(tmp_path: Path):
    config = SynthMathConfig(families=("gcd",), levels=(2,), n_train=5, n_test=5)
    train_path, test_path = write_synth_splits(config, tmp_path)
    mtimes = [train_path.stat().st_mtime_ns, test_path.stat().st_mtime_ns]
    assert write_synth_splits(config, tmp_path) == (train_path, test_path)
    assert [train_path.stat().st_mtime_ns, test_path.stat().st_mtime_ns] == mtimes
    with pytest.raises(ValueError, match=r"n_train: recorded 5, requested 6"):
        write_synth_splits(SynthMathConfig(families=("gcd",), levels=(2,), n_train=6, n_test=5), tmp_path)


def test_a_cell_that_runs_out_of_problems_is_an_error(tmp_path: Path):
    with pytest.raises(ValueError, match=r"family 'gcd' level 1 ran out of distinct problems"):
        write_synth_splits(SynthMathConfig(families=("gcd",), levels=(1,), n_train=10_000, n_test=1), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"families": ("arithmetic", "topology")}, r"SynthMathConfig.families: unknown 'topology'; valid families: "
                                                   r"arithmetic, fractions, linear, polynomial, gcd, columns"),
        ({"families": "linear"}, r"SynthMathConfig.families must be a non-empty tuple"),
        ({"families": ()}, r"SynthMathConfig.families must be a non-empty tuple"),
        ({"levels": (0, 1)}, r"SynthMathConfig.levels: unknown 0; valid levels: 1, 2, 3"),
        ({"levels": (1, 1)}, r"SynthMathConfig.levels must not repeat"),
        ({"n_test": 0}, r"SynthMathConfig.n_test must be an integer >= 1"),
        ({"n_train": 2.5}, r"SynthMathConfig.n_train must be an integer >= 1"),
        ({"seed": "0"}, r"SynthMathConfig.seed must be an integer"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        SynthMathConfig(**kwargs)


def test_lists_are_stored_as_tuples():
    config = SynthMathConfig(families=["linear"], levels=[2, 1])
    assert (config.families, config.levels) == (("linear",), (2, 1))
    assert config.cells == [("linear", 2), ("linear", 1)]


def test_cli_writes_the_splits_and_reports_counts(tmp_path: Path):
    out = tmp_path / "synth"
    args = ["data", "synth", "--out", str(out), "--families", "arithmetic,polynomial", "--levels", "1,3",
            "--n-train", "10", "--n-test", "6", "--seed", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1:6] == [
        "arithmetic       1       3       2",
        "arithmetic       3       3       2",
        "polynomial       1       2       1",
        "polynomial       3       2       1",
        "total                   10       6",
    ]
    assert lines[6:] == [f"train: {out / 'train.jsonl'}", f"test:  {out / 'test.jsonl'}"]
    config = SynthMathConfig(families=("arithmetic", "polynomial"), levels=(1, 3), n_train=10, n_test=6, seed=2)
    assert (read_rows(out / "train.jsonl"), read_rows(out / "test.jsonl")) == tuple(generate_synth_splits(config))
    # Again with the same options: the files are reused and the counts reported again.
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and again.output == result.output
    worked = CliRunner().invoke(main, [*args[:3], str(tmp_path / "worked"), *args[4:], "--solutions"])
    assert worked.exit_code == 0, worked.output
    assert read_rows(tmp_path / "worked" / "test.jsonl") == generate_synth_splits(
        SynthMathConfig(families=("arithmetic", "polynomial"), levels=(1, 3), n_train=10, n_test=6, seed=2,
                        solutions=True))[1]


def test_cli_help_lists_every_family():
    result = CliRunner().invoke(main, ["data", "synth", "--help"])
    assert result.exit_code == 0
    assert all(family in result.output for family in FAMILIES)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--families", "arithmetic,topology"], "Invalid value for --families: unknown topology; valid families: "),
        (["--families", ","], "Invalid value for '--families': give at least one value"),
        (["--levels", "0"], "Invalid value for --levels: 0: levels must be integers from 1 to 3"),
        (["--levels", "one"], "Invalid value for --levels"),
        (["--n-test", "0"], "Invalid value for '--n-test': 0 is not in the range x>=1"),
        (["--n-train", "-1"], "Invalid value for '--n-train'"),
    ],
)
def test_cli_bad_options_name_the_option(tmp_path: Path, options: list[str], message: str):
    result = CliRunner().invoke(main, ["data", "synth", "--out", str(tmp_path / "out"), *options])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_cli_reports_a_conflicting_out_directory(tmp_path: Path):
    base = ["data", "synth", "--out", str(tmp_path), "--families", "gcd", "--levels", "1"]
    assert CliRunner().invoke(main, [*base, "--n-train", "4", "--n-test", "2"]).exit_code == 0
    result = CliRunner().invoke(main, [*base, "--n-train", "5", "--n-test", "2"])
    assert result.exit_code == 1
    assert "holds splits made with other parameters (n_train: recorded 4, requested 5)" in result.output


# ----------------------------------------------------------------------------- worked solutions (reasoning task)

# solution tokens under the reasoning tokenizer, per cell: most fit a 40-150-token response; these two run longer
# (a length sweep's long end: fractions of three terms, a cubic at a fraction)
LONG_CELLS = {("fractions", 3): (100, 250), ("polynomial", 3): (100, 250), ("columns", 3): (100, 250)}


@pytest.fixture(scope="module")
def worked() -> list[dict]:
    config = SynthMathConfig(n_train=1, n_test=SAMPLE_PER_CELL * len(FAMILIES) * len(LEVELS), seed=11,
                             solutions=True)
    return generate_synth_splits(config)[1]


def test_worked_solutions_leave_the_problems_as_they_were(sample: list[dict], worked: list[dict]):
    assert [{k: v for k, v in row.items() if k != "solution"} for row in worked] == sample
    assert all(set(row) == {"id", "problem", "answer", "family", "level", "solution"} for row in worked)
    again = generate_synth_splits(SynthMathConfig(n_train=1, n_test=len(worked), seed=11, solutions=True))[1]
    assert again == worked  # deterministic
    other = generate_synth_splits(SynthMathConfig(n_train=1, n_test=len(worked), seed=12, solutions=True))[1]
    assert [r["solution"] for r in other] != [r["solution"] for r in worked]


def test_worked_solutions_end_in_the_gold_box_and_the_math_verifier_accepts_them(worked: list[dict], verifier):
    solutions = [row["solution"] for row in worked]
    assert all(s.rstrip().endswith(f"$\\boxed{{{row['answer']}}}$.") for s, row in zip(solutions, worked))
    assert all(2 <= len(s.splitlines()) <= 5 for s in solutions)  # a few steps, then the answer
    golds = [row["answer"] for row in worked]
    assert verifier.score_batch(solutions, golds) == [1.0] * len(worked)
    # the last box is what counts: the same steps with a wrong final box score 0
    wrong = [s.replace(f"\\boxed{{{g}}}", f"\\boxed{{{other_forms(g)[1]}}}") for s, g in zip(solutions, golds)]
    assert verifier.score_batch(wrong, golds) == [0.0] * len(worked)


def test_worked_solution_steps_by_hand():
    from ggpo_lightning.tasks.synth_math import _column_steps, _euclid, _evaluation_steps, _pair_step

    assert _pair_step(sympy.Rational(1, 2), "+", sympy.Rational(1, 3), fractions=True) == \
        "Over $6$: $\\frac{3}{6} + \\frac{2}{6} = \\frac{5}{6}$."
    assert _pair_step(sympy.Rational(2, 3), "*", sympy.Rational(3, 4), fractions=True) == \
        "Multiply: $\\frac{2}{3} \\times \\frac{3}{4} = \\frac{6}{12} = \\frac{1}{2}$."
    assert _evaluation_steps([2, 3, 4], ["+", "*"], fractions=False) == ["$3 \\times 4 = 12$.", "$2 + 12 = 14$."]
    assert _euclid(365, 219) == "$365 = 1 \\times 219 + 146$, then the remainders $73, 0$"
    assert _column_steps(47, 38, "+") == (["Units: $7 + 8 = 15$, write $5$, carry $1$.",
                                           "Tens: $4 + 3 + 1 = 8$, write $8$."], "85")
    assert _column_steps(95, 87, "+") == (["Units: $5 + 7 = 12$, write $2$, carry $1$.",
                                           "Tens: $9 + 8 + 1 = 18$, write $18$."], "182")
    assert _column_steps(503, 497, "-") == (["Units: $3 - 7$ borrows: $13 - 7 = 6$, write $6$.",
                                             "Tens: $0 - 1 - 9$ borrows: $9 - 9 = 0$, write $0$.",
                                             "Hundreds: $5 - 1 - 4 = 0$, write $0$."], "6")


def test_the_forgotten_carry_slip_by_hand():
    from ggpo_lightning.tasks.synth_math import forgotten_carry

    assert forgotten_carry("Compute $47 + 38$ column by column.") == (
        "75", "Units: $7 + 8 = 15$, write $5$, carry $1$.\nTens: $4 + 3 = 7$, write $7$.\n"
        "The final answer is $\\boxed{75}$.")
    assert forgotten_carry("Compute $53 - 29$ column by column.") == (
        "34", "Units: $3 - 9$ borrows: $13 - 9 = 4$, write $4$.\nTens: $5 - 2 = 3$, write $3$.\n"
        "The final answer is $\\boxed{34}$.")
    # every borrow forgotten: the tens borrow on their own (0 < 9), the hundreds ignore it
    assert forgotten_carry("Compute $503 - 497$ column by column.")[0] == "116"
    assert forgotten_carry("Compute $21 + 38$ column by column.") is None  # no carry: nothing to forget
    assert forgotten_carry("Compute $4 + 3$.") is None  # not a columns problem


def test_forgotten_carries_are_wrong_exactly_on_the_problems_that_carry(verifier):
    from ggpo_lightning.tasks.synth_math import forgotten_carry

    rows = SynthMathTask(families=["columns"], levels=[1, 2, 3]).problems(300, seed=3)
    slipped = [forgotten_carry(row["problem"]) for row in rows]
    carries = [", carry $1$" in row["solution"] or "borrows" in row["solution"] for row in rows]
    assert [s is not None for s in slipped] == carries and 0.3 < sum(carries) / len(rows) < 0.95
    answers = [s[0] for s in slipped if s is not None]
    solutions = [s[1] for s in slipped if s is not None]
    golds = [row["answer"] for row, s in zip(rows, slipped) if s is not None]
    assert all(solution.endswith(f"$\\boxed{{{answer}}}$.") for answer, solution in zip(answers, solutions))
    assert verifier.score_batch(solutions, golds) == [0.0] * len(golds)
    assert verifier.score_batch(solutions, answers) == [1.0] * len(golds)  # consistent with what it writes


def test_worked_solutions_fit_the_reasoning_tokenizer(worked: list[dict]):
    from ggpo_lightning.records.prompts import PAPER_TEMPLATE
    from ggpo_lightning.tasks.tiny_model import build_reasoning_tokenizer

    tokenizer = build_reasoning_tokenizer()
    lengths: dict[tuple[str, int], list[int]] = {}
    for row in worked:
        ids = tokenizer(row["solution"], add_special_tokens=False)["input_ids"]
        prompt = tokenizer(PAPER_TEMPLATE.format(prompt=row["problem"]))["input_ids"]
        assert tokenizer.unk_token_id not in ids + prompt, row
        assert tokenizer.decode(ids) == row["solution"]
        lengths.setdefault((row["family"], row["level"]), []).append(len(ids) + 1)  # + <eos>
    for cell, values in lengths.items():
        low, high = LONG_CELLS.get(cell, (40, 150))
        assert low <= min(values) and max(values) <= high, (cell, min(values), max(values))


def test_solutions_are_recorded_only_when_asked(tmp_path: Path):
    plain = write_synth_splits(SynthMathConfig(n_train=5, n_test=5), tmp_path / "plain")
    assert "solutions" not in json.loads((plain[0].parent / "task.json").read_text())  # older splits stay valid
    worked = write_synth_splits(SynthMathConfig(n_train=5, n_test=5, solutions=True), tmp_path / "worked")
    assert all("solution" in row for row in read_rows(worked[0]))
    with pytest.raises(ValueError):
        write_synth_splits(SynthMathConfig(n_train=5, n_test=5, solutions=True), tmp_path / "plain")


def test_the_reasoning_task_streams_worked_problems_cell_by_cell_and_writes_splits_with_them(tmp_path: Path):
    task = SynthMathTask(families=["linear", "gcd"], levels=[1, 2])
    rows = task.problems(10, seed=3)
    assert [(r["family"], r["level"]) for r in rows[:4]] == task.cells  # in turn, cell by cell
    assert task.problems(6, seed=3) == rows[:6] and task.problems(10, seed=4) != rows  # a seed's stream
    assert all(row["solution"].endswith(f"$\\boxed{{{row['answer']}}}$.") for row in rows)
    train, test = task.write_splits(tmp_path, n_train=8, n_test=4, seed=3)
    assert len(read_rows(train)) == 8 and all("solution" in row for row in read_rows(train) + read_rows(test))
    assert json.loads((tmp_path / "task.json").read_text())["families"] == ["linear", "gcd"]
    with pytest.raises(ValueError, match="SynthMathTask.families: unknown 'calculus'"):
        SynthMathTask(families=("calculus",))
