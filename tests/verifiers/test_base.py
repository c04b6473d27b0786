"""Behaviour every verifier inherits: outcome statistics, the verdict cache, gold
validation, input checking and the failure modes of plugin hooks."""

from __future__ import annotations

import logging

import pytest

from ggpo_verifiers import ExactVerifier, GoldAnswerError, MathVerifier, NumericVerifier, Status, Verifier


class _Inline(Verifier):
    """An in-process test verifier: check returns float(answer), None for "?"."""

    isolated = False

    def check(self, answer: str, gold: str) -> float | None:
        return None if answer == "?" else float(answer)


class _BrokenExtract(_Inline):
    def extract(self, response: str) -> str | None:
        raise RuntimeError("extract exploded")


def test_statuses_and_stats() -> None:
    verifier = _Inline()
    outcomes = verifier.evaluate_batch(["1", "0", "?", "2", "nan", "x"], ["g"] * 6)
    assert [o.status for o in outcomes] == [
        Status.CORRECT, Status.WRONG, Status.UNPARSEABLE, Status.CRASHED, Status.CRASHED, Status.CRASHED,
    ]  # fmt: skip
    assert [o.score for o in outcomes] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    stats = verifier.stats
    assert (stats.correct, stats.wrong, stats.unparseable, stats.crashed, stats.total) == (1, 1, 1, 3, 6)
    assert stats.accuracy == pytest.approx(1 / 6)
    logged = stats.as_dict(prefix="verifier/")
    assert logged["verifier/crashed"] == 3 and logged["verifier/total"] == 6
    assert set(logged) == {
        f"verifier/{key}"
        for key in (
            "correct", "wrong", "unparseable", "timeout", "crashed", "bad_gold", "cache_hits", "unboxed", "total",
            "accuracy", "unboxed_share",
        )
    }


def test_reset_stats_returns_the_old_counts() -> None:
    verifier = ExactVerifier()
    verifier.score("a", "a")
    assert verifier.reset_stats().correct == 1
    assert verifier.stats.total == 0


def test_repeated_pairs_are_checked_once() -> None:
    verifier = ExactVerifier()
    responses, golds = ["a", "a", "b", r"\boxed{a}"], ["a"] * 4
    assert verifier.score_batch(responses, golds) == [1.0, 1.0, 0.0, 1.0]
    assert verifier.stats.cache_hits == 2  # a duplicate response and a same-answer box
    assert verifier.score_batch(responses, golds) == [1.0, 1.0, 0.0, 1.0]
    assert verifier.stats.cache_hits == 2 + 4


def test_the_cache_is_bounded() -> None:
    verifier = ExactVerifier(cache_size=2)
    verifier.score_batch(["a", "b", "c"], ["a"] * 3)  # "a" is evicted
    verifier.score_batch(["c", "a"], ["a"] * 2)
    assert verifier.stats.cache_hits == 1


def test_a_failing_extract_is_a_crash_not_an_exception() -> None:
    verifier = _BrokenExtract()
    assert verifier.evaluate_batch(["1"], ["g"])[0] == (0.0, Status.CRASHED)


def test_input_shapes_and_types_are_checked() -> None:
    with pytest.raises(ValueError, match="2 responses but 1 golds"):
        ExactVerifier().score_batch(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="response #1 is a NoneType"):
        ExactVerifier().score_batch(["a", None], ["a", "a"])  # type: ignore[list-item]


def test_bad_golds_score_zero_are_counted_and_logged(math_verifier, caplog) -> None:
    math_verifier.reset_stats()
    with caplog.at_level(logging.WARNING, logger="ggpo_verifiers.base"):
        outcomes = math_verifier.evaluate_batch([r"\boxed{1}", r"\boxed{1}"], [r"\frac{1}{", "1"])
    assert outcomes == [(0.0, Status.BAD_GOLD), (1.0, Status.CORRECT)]
    assert math_verifier.stats.bad_gold == 1
    assert "1 response(s) scored 0.0 because their gold answer is unusable" in caplog.text


def test_validate_golds_names_the_first_bad_row(math_verifier) -> None:
    math_verifier.validate_golds(["1", r"\frac12", "x^2+1", r"\{1,2\}", r"(0, 1]", r"\begin{pmatrix}1\\2\end{pmatrix}"])
    with pytest.raises(GoldAnswerError) as caught:
        math_verifier.validate_golds(["1", "2", r"\frac{1}{", ""])
    error = caught.value
    assert (error.index, error.gold) == (2, r"\frac{1}{")
    assert r"unusable gold answer '\frac{1}{' (gold #2)" in str(error)
    assert "use the 'exact' verifier" in str(error)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(("gold", "reason"), [("", "empty"), ("  ", "empty"), (3, "it is a int, not a string")])
def test_validate_gold_rejects_empty_and_non_string_golds(math_verifier, gold: object, reason: str) -> None:
    with pytest.raises(GoldAnswerError, match=reason) as caught:
        math_verifier.validate_gold(gold)  # type: ignore[arg-type]
    assert caught.value.index is None


UNBOXED_MIX = [r"so \boxed{1}", "It is 1.", "no answer at all", r"\boxed{1", r"\fbox{1} and more text"]
"""Two boxed responses (one with fbox) and three without (an unbalanced box is none)."""


def test_unboxed_responses_are_counted_whatever_their_outcome(math_verifier) -> None:
    math_verifier.reset_stats()
    outcomes = math_verifier.evaluate_batch(UNBOXED_MIX, ["1"] * len(UNBOXED_MIX))
    assert [o.score for o in outcomes] == [1.0, 1.0, 0.0, 0.0, 1.0]  # "\boxed{1": a 1 after a brace is no answer
    stats = math_verifier.reset_stats()
    assert (stats.unboxed, stats.total) == (3, 5)
    assert stats.as_dict(prefix="verifier/")["verifier/unboxed_share"] == pytest.approx(0.6)


@pytest.mark.parametrize(
    "verifier",
    [MathVerifier(fallbacks=()), NumericVerifier(), ExactVerifier()],
    ids=["math-box-required", "numeric", "exact"],
)
def test_every_builtin_counts_unboxed_responses(verifier: Verifier) -> None:
    responses = [r for r in UNBOXED_MIX if "boxed{1}" not in r and "fbox" not in r]  # no worker needed
    verifier.evaluate_batch(responses, ["1"] * len(responses))
    assert (verifier.stats.unboxed, verifier.stats.total) == (3, 3)


@pytest.mark.parametrize("verifier", [NumericVerifier(), ExactVerifier()], ids=["numeric", "exact"])
def test_boxed_responses_are_not_counted_unboxed(verifier: Verifier) -> None:
    verifier.evaluate_batch([r"so \boxed{1}", r"\fbox{1}"], ["1", "1"])
    assert (verifier.stats.unboxed, verifier.stats.correct) == (0, 2)


def test_a_verifier_without_boxes_counts_nothing_unboxed() -> None:
    verifier = _Inline()
    verifier.evaluate_batch(["1", "0"], ["g", "g"])
    assert verifier.stats.unboxed == 0
