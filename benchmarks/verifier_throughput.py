"""Throughput of the ``math`` verifier: checks per second, one process vs the worker pool.

    .venv/bin/python benchmarks/verifier_throughput.py            # 10k pairs, pools of 1 and 2
    .venv/bin/python benchmarks/verifier_throughput.py --n 2000 --workers 1,2,4
    .venv/bin/python benchmarks/verifier_throughput.py --n 2000 --unboxed   # answers in $...$
    .venv/bin/python benchmarks/verifier_throughput.py --n 2000 --multi     # + answers in several boxes

The pairs are typical RL rewards: a few hundred characters of reasoning ending in a
``\\boxed{}`` answer (with ``--unboxed``: in ``$...$``, which the worker's fallback
extraction must find), gold answers that are integers, fractions, decimals, radicals,
polynomials or tuples, about half answered correctly in another notation (``0.5`` for
``\\frac12``). With ``--multi`` a quarter of the golds are lists of two values, answered
in two boxes (``\\boxed{7} \\quad\\text{and}\\quad \\boxed{3}`` for ``3, 7``). All pairs
are distinct and the cache is off, so every pair is checked.

Modes:
* ``in-process``: ``extract`` + ``check`` in a loop in this process: the cost of the
  check itself, without isolation (what a trainer calling math-verify directly pays,
  minus its timeouts).
* ``pool(N)``: ``score_batch`` on a warm pool of N workers (start-up reported apart).
* ``pool(N)+groups``: RL groups (8 responses per prompt, repeated answers within a
  group) with the verdict cache on.

Every mode must produce the same scores; the script checks that. On a shared machine
another process may hold a core: compare modes within one run.
"""

from __future__ import annotations

import argparse
import random
import time

from ggpo_verifiers import MathVerifier
from ggpo_verifiers.base import run_check

FILLER = (
    "Let us set up the problem carefully. We write the given quantities, simplify the "
    "expression step by step and check the boundary cases before concluding. "
)


def _number_pair(rng: random.Random, multi: bool = False) -> tuple[str, str, str]:
    """(gold, the same value in another notation, a wrong value). A ``multi`` list's
    answers are the insides of two boxes: ``make_pairs`` wraps them in the outer box."""
    kinds = ["int", "int", "frac", "decimal", "sqrt", "poly", "tuple"]
    kind = rng.choice(kinds + ["list"] * (len(kinds) // 3 if multi else 0))
    a, b = rng.randint(1, 999), rng.randint(2, 99)
    if kind == "list":
        join = "} \\quad\\text{and}\\quad \\boxed{"
        return f"{a}, {b}", f"{b}{join}{a}", f"{a}{join}{b + 1}"
    if kind == "int":
        return str(a), f"{a}", str(a + rng.randint(1, 9))
    if kind == "frac":
        return f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{2 * a}}}{{{2 * b}}}", f"\\frac{{{a + 1}}}{{{b}}}"
    if kind == "decimal":
        return f"\\frac{{{a}}}{{4}}", f"{a / 4}", f"{a / 4 + 0.5}"
    if kind == "sqrt":
        return f"{b}\\sqrt{{2}}", f"\\sqrt{{{2 * b * b}}}", f"{b}\\sqrt{{3}}"
    if kind == "poly":
        return f"x^2 + {2 * b}x + {b * b}", f"(x+{b})^2", f"(x-{b})^2"
    return f"({a}, {b})", f"\\left({a},{b}\\right)", f"({b}, {a})"


def make_pairs(
    n: int, seed: int, group_size: int = 1, boxed: bool = True, multi: bool = False
) -> tuple[list[str], list[str]]:
    """``n`` (response, gold) pairs. With ``group_size`` 1 every (answer, gold) pair is
    distinct, so each one costs a check; with more, groups of responses to one prompt
    repeat a right and a wrong answer (RL sampling). ``boxed=False`` writes the final
    answer as ``$...$`` instead of ``$\\boxed{...}$``; ``multi`` adds lists answered in
    two boxes."""
    rng = random.Random(seed)
    responses: list[str] = []
    golds: list[str] = []
    seen: set[tuple[str, str]] = set()
    while len(responses) < n:
        gold, right, wrong = _number_pair(rng, multi)
        for _ in range(group_size):
            answer = rng.choice([right, wrong])
            if group_size == 1 and (answer, gold) in seen:
                continue
            seen.add((answer, gold))
            reasoning = FILLER * rng.randint(1, 4)
            final = f"\\boxed{{{answer}}}" if boxed else answer
            responses.append(f"{reasoning}Therefore the answer is ${final}$.")
            golds.append(gold)
    return responses[:n], golds[:n]


def in_process(verifier: MathVerifier, responses: list[str], golds: list[str]) -> list[float]:
    scores = []
    for response, gold in zip(responses, golds):
        answer = verifier.extract(response)
        scores.append(0.0 if answer is None else run_check(verifier, "check", (answer, gold))[1])
    return scores


def report(mode: str, n: int, seconds: float, scores: list[float]) -> None:
    print(f"{mode:<18} {n:>7} {seconds:>9.2f} {n / seconds:>10.1f} {sum(scores) / n:>9.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of (response, gold) pairs")
    parser.add_argument("--workers", default="1,2", help="comma-separated pool sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unboxed", action="store_true", help="final answers in $...$, without a box")
    parser.add_argument("--multi", action="store_true", help="a quarter of the answers in two boxes")
    args = parser.parse_args()
    if args.multi and args.unboxed:
        parser.error("--multi writes boxes: it excludes --unboxed")
    responses, golds = make_pairs(args.n, args.seed, boxed=not args.unboxed, multi=args.multi)

    print(f"{'mode':<18} {'checks':>7} {'seconds':>9} {'checks/s':>10} {'accuracy':>9}")
    verifier = MathVerifier(cache_size=0)
    verifier.warmup()
    start = time.perf_counter()
    reference = in_process(verifier, responses, golds)
    report("in-process", args.n, time.perf_counter() - start, reference)

    for workers in (int(w) for w in args.workers.split(",")):
        with MathVerifier(workers=workers, cache_size=0) as pooled:
            start = time.perf_counter()
            pooled.score(r"\boxed{1}", "1")
            startup = time.perf_counter() - start
            start = time.perf_counter()
            scores = pooled.score_batch(responses, golds)
            report(f"pool({workers})", args.n, time.perf_counter() - start, scores)
            stats = pooled.stats
        assert scores == reference, f"pool({workers}) disagrees with in-process scoring"
        print(f"{'':<18} start-up {startup:.2f} s; timeouts {stats.timeout}, crashes {stats.crashed}")

    grouped_responses, grouped_golds = make_pairs(
        args.n, args.seed, group_size=8, boxed=not args.unboxed, multi=args.multi
    )
    workers = max(int(w) for w in args.workers.split(","))
    with MathVerifier(workers=workers) as cached:
        cached.score(r"\boxed{1}", "1")
        cached.reset_stats()
        start = time.perf_counter()
        scores = cached.score_batch(grouped_responses, grouped_golds)
        report(f"pool({workers})+groups", args.n, time.perf_counter() - start, scores)
        print(f"{'':<18} cache hits {cached.stats.cache_hits} of {args.n}")


if __name__ == "__main__":
    main()
