"""Hostile model outputs against the built-in verifiers: nothing executes, nothing hangs
the caller, the pool keeps working — from the main thread, another thread and a daemonic
forked process (what a PyTorch DataLoader worker is)."""

from __future__ import annotations

import multiprocessing
import random
import re
import shutil
import string
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ggpo_verifiers import ExactVerifier, GoldAnswerError, MathVerifier, NumericVerifier, Status, gold_from_solution

TIMEOUT = 1.0  # the dos_verifier's timeout (conftest)
MARGIN = 2.0  # kill + replacement start on a loaded 2-core machine

CODE_PAYLOADS = [
    r"\boxed{__import__('os').system('touch {marker}')}",
    r"\boxed{__import__(chr(111)+chr(115)).system('touch {marker}')}",
    r"\boxed{eval(\"__import__('os').system('touch {marker}')\")}",
    r"\boxed{exec('import os; os.system(\"touch {marker}\")')}",
    r"\boxed{(lambda: __import__('os').system('touch {marker}'))()}",
    r"\boxed{open('{marker}', 'w').write('x')}",
    r"\boxed{sympify('__import__(\"os\").system(\"touch {marker}\")')}",
    r"\boxed{\text{__import__('os').system('touch {marker}')}}",
    r"\boxed{\operatorname{__import__}('os').system('touch {marker}')}",
    r"$__import__('os').system('touch {marker}')$",
    "The answer is __import__('os').system('touch {marker}')",
    "answer: 1 + __import__('os').system('touch {marker}')",
]

# Each hangs math-verify/sympy for far longer than the timeout (tens of seconds to hours).
DOS_ANSWERS = [
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{1E1000000}",
    r"\boxed{(10^{10})!}",
    r"\boxed{100000000!}",
    r"\boxed{2^{2^{30}}}",
    r"\boxed{10^{10^{10}}}",
    r"The answer is $9^{9^{9^{9}}}$.",  # no box: the worker's extraction parses it
    "So we get 9^9^9^9",  # plain expression: math-verify hands it to sympy.parse_expr
]


@pytest.fixture
def marker() -> Iterator[Path]:
    """A file path with no digits in it: the payloads embed it, and the last-number
    fallback would otherwise read a digit of the path as the answer."""
    name = "".join(random.choices(string.ascii_lowercase, k=16))
    folder = Path(tempfile.gettempdir()) / f"ggpo_marker_{name}"
    assert not any(ch.isdigit() for ch in str(folder))
    folder.mkdir()
    yield folder / "pwned"
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def unfiltered() -> MathVerifier:
    """A math verifier with the parent-side length/depth filters off, so hostile inputs
    reach the worker: the pool alone must contain them."""
    with MathVerifier(
        timeout=TIMEOUT, workers=2, cache_size=0, max_answer_chars=10**7, max_answer_depth=10**7, tail_chars=10**7
    ) as verifier:
        yield verifier


@pytest.mark.parametrize("gold", ["0", "1"])
def test_code_payloads_execute_nothing_and_score_zero(math_verifier, marker: Path, gold: str) -> None:
    # gold "0": a verifier that evaluated the payload would get os.system's 0 and reward it.
    responses = [payload.replace("{marker}", str(marker)) for payload in CODE_PAYLOADS]
    responses.append(r"\boxed{__import__('os').system('true')}")
    verifiers = [math_verifier, ExactVerifier(), NumericVerifier()]
    for verifier in verifiers:
        assert verifier.score_batch(responses, [gold] * len(responses)) == [0.0] * len(responses)
    assert not marker.exists()


@pytest.mark.parametrize("response", DOS_ANSWERS)
def test_dos_answers_score_zero_within_the_timeout(dos_verifier, response: str) -> None:
    assert dos_verifier.score(r"\boxed{1}", "1") == 1.0  # workers up: time only the attack
    start = time.perf_counter()
    outcome = dos_verifier.evaluate_batch([response], ["3"])[0]
    assert time.perf_counter() - start < TIMEOUT + MARGIN
    assert outcome.score == 0.0
    assert outcome.status in (Status.TIMEOUT, Status.CRASHED)
    assert dos_verifier.score(r"\boxed{2}", "2") == 1.0  # the pool survived


def test_huge_responses_are_cheap_to_reject(dos_verifier) -> None:
    responses = [
        "x" * 1_000_000 + r" so \boxed{2}",  # long, but the answer is at the end
        r"\boxed{" + "1" * 1_000_000 + "}",  # a megabyte answer
        "\\[" * 500_000,  # a flood of display-math openers
        r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",  # 10k nested braces
        "{" * 10_000 + "1" + "}" * 10_000,
    ]
    start = time.perf_counter()
    outcomes = dos_verifier.evaluate_batch(responses, ["2"] * len(responses))
    assert time.perf_counter() - start < TIMEOUT
    assert [o.score for o in outcomes] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert [o.status for o in outcomes[1:4]] == [Status.UNPARSEABLE] * 3


def test_the_pool_contains_huge_inputs_that_pass_the_filters(unfiltered) -> None:
    responses = [
        r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
        r"\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
        r"\boxed{" + "1+" * 300_000 + "1}",
        r"\boxed{" + "\\[" * 300_000 + "}",
        "$" + "1+" * 300_000 + "1$",  # no box: math-verify's extraction regexes on 600 kB
        "$x$ " * 150_000,
    ]
    start = time.perf_counter()
    assert unfiltered.score_batch(responses, ["1"] * len(responses)) == [0.0] * len(responses)
    # each response may run out its timeout and cost a worker's kill and replacement (once missed at 6 x 1 s + 4 s
    # under three test runs' load on two cores)
    assert time.perf_counter() - start < len(responses) * (TIMEOUT + MARGIN)
    assert unfiltered.score(r"\boxed{\frac{1}{2}}", "0.5") == 1.0


def test_timeouts_work_from_a_non_main_thread(dos_verifier) -> None:
    results: list[list[float]] = []
    thread = threading.Thread(
        target=lambda: results.append(dos_verifier.score_batch([DOS_ANSWERS[0], r"\boxed{2}"], ["1", "2"]))
    )
    start = time.perf_counter()
    thread.start()
    thread.join(timeout=30)
    assert results == [[0.0, 1.0]]
    assert time.perf_counter() - start < TIMEOUT + 2 * MARGIN


def _score_in_child(verifier: MathVerifier, queue: multiprocessing.Queue) -> None:
    with verifier:
        queue.put(verifier.score_batch([DOS_ANSWERS[0], r"\boxed{2}"], ["1", "2"]))


def test_works_in_a_daemonic_forked_process_like_a_dataloader_worker(dos_verifier) -> None:
    # multiprocessing refuses to start children from daemonic processes; the pool must not
    # depend on it. The child inherits the parent's live pool object and must not use it.
    assert dos_verifier.score(r"\boxed{1}", "1") == 1.0
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_score_in_child, args=(dos_verifier, queue), daemon=True)
    child.start()
    result = queue.get(timeout=60)
    child.join(timeout=10)
    assert result == [0.0, 1.0]
    assert child.exitcode == 0
    assert dos_verifier.score(r"\boxed{2}", "2") == 1.0  # the parent's workers are intact


def test_plain_expressions_reach_parse_expr_without_python_names(monkeypatch) -> None:
    # math-verify hands plain-text expressions to sympy.parse_expr (eval). Whatever the
    # response, what reaches it must be digits and operators only: no name to call.
    import math_verify.parser

    from ggpo_verifiers.equivalence import math_verify_answer

    seen: list[str] = []
    original = math_verify.parser.parse_expr_cached
    monkeypatch.setattr(math_verify.parser, "parse_expr_cached", lambda expr: seen.append(expr) or original(expr))
    texts = [
        "answer: 2 + __import__('os').getpid()",
        "The answer is 1 + exec('x')",
        "So it is (3 + 4) * 2",
        "x = 9^2 - 1",
        "final answer is 2*__builtins__",
        "answer = 2 + 3 lambda: 1",
        *(payload.replace("{marker}", "m") for payload in CODE_PAYLOADS),
    ]
    for text in texts:
        math_verify_answer(text)
    assert len(seen) >= 2, "the plain-expression path was not exercised"
    assert all(re.fullmatch(r"[\d.\s+\-*/()]*", expr) for expr in seen), seen


def test_box_chains_phrases_and_solution_golds_are_bounded_work() -> None:
    """The extraction added for several boxes, "final answer is" and solution golds runs
    in the trainer process: linear on megabyte inputs built to make it slow."""
    floods = [
        "final answer " * 80_000,  # the phrase regex scans up to 100 characters per start
        "The final answer is " * 50_000 + "$",
        r"\boxed{1} and " * 80_000,  # a chain of boxes as long as the text
        r"\boxed{1} " + "and , " * 200_000 + r"\boxed{2}",  # one huge gap of separators
        "#### \n" * 150_000,
        "We count the ways, " * 50_000,  # prose
    ]
    verifier = MathVerifier()
    start = time.perf_counter()
    for text in floods:
        verifier.extract(text)
        try:
            gold_from_solution(text)
        except GoldAnswerError:
            pass
    assert time.perf_counter() - start < 3.0
    assert verifier._pool is None  # nothing left the process
