"""The worker pool contains checks that hang, crash, lie or try side effects.

Uses ``hostile_verifiers.HostileVerifier`` (tests/verifiers/fixtures/hostile), whose
check does whatever the answer names, run through the same pool as every plugin.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

from ggpo_verifiers import Status, WorkerStartupError

TIMEOUT = 1.0
MARGIN = 2.0  # process kill + replacement start on a loaded 2-core machine


@pytest.fixture(scope="module")
def hostile(hostile_module):
    with hostile_module.HostileVerifier(timeout=TIMEOUT, workers=2, cache_size=0) as verifier:
        yield verifier


def statuses(verifier, answers: list[str], gold: str = "g") -> list[Status]:
    return [outcome.status for outcome in verifier.evaluate_batch(answers, [gold] * len(answers))]


def test_a_check_stuck_in_c_code_is_killed_at_the_deadline(hostile) -> None:
    # A signal-based timeout cannot stop this (the call never checks for signals);
    # nor can concurrent.futures' future.result(timeout).
    hostile.score("ok", "g")  # workers started
    start = time.perf_counter()
    assert statuses(hostile, ["c_hang"]) == [Status.TIMEOUT]
    assert time.perf_counter() - start < TIMEOUT + MARGIN
    assert hostile.score("ok", "g") == 1.0


def test_a_batch_continues_past_timeouts_and_crashes(hostile) -> None:
    answers = ["spin", "ok", "exit", "wrong", "abort", "raise", "ok", "nan", "half", "c_hang", "ok"]
    hostile.reset_stats()
    start = time.perf_counter()
    outcomes = hostile.evaluate_batch(answers, ["g"] * len(answers))
    assert [o.status for o in outcomes] == [
        Status.TIMEOUT, Status.CORRECT, Status.CRASHED, Status.WRONG, Status.CRASHED,
        Status.CRASHED, Status.CORRECT, Status.CRASHED, Status.CORRECT, Status.TIMEOUT,
        Status.CORRECT,
    ]  # fmt: skip
    assert [o.score for o in outcomes] == [0, 1, 0, 0, 0, 0, 1, 0, 0.5, 0, 1]
    # Two workers, two hangs: the hangs overlap the other checks, so about one timeout.
    assert time.perf_counter() - start < 2 * TIMEOUT + 3 * MARGIN
    stats = hostile.stats
    assert (stats.correct, stats.wrong, stats.timeout, stats.crashed) == (4, 1, 2, 4)


def test_memory_is_capped(hostile) -> None:
    assert hostile.score("memory_limit", "g") == pytest.approx(1024 * 2**20 / 2**32)
    assert statuses(hostile, ["alloc", "ok"]) == [Status.CRASHED, Status.CORRECT]


@pytest.mark.parametrize("command", ["system", "write", "subprocess"])
def test_workers_refuse_side_effects(hostile, tmp_path, command: str) -> None:
    marker = tmp_path / "pwned"
    assert statuses(hostile, [command], gold=str(marker)) == [Status.CRASHED]
    assert not marker.exists()


def test_side_effect_guard_is_what_stops_them(hostile_module, tmp_path) -> None:
    marker = tmp_path / "written"
    with hostile_module.SideEffectVerifier(timeout=5.0, workers=1) as verifier:
        assert verifier.score("write", str(marker)) == 1.0
    assert marker.read_text() == "pwned"


def test_workers_are_recycled_after_max_tasks(hostile_module) -> None:
    with hostile_module.HostileVerifier(workers=1, max_tasks_per_worker=2, cache_size=0) as verifier:
        pids = [verifier.score("pid", "g") for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


def test_close_kills_workers_and_the_verifier_restarts_on_use(hostile_module) -> None:
    verifier = hostile_module.HostileVerifier(workers=2)
    assert verifier.score("ok", "g") == 1.0
    pids = verifier._pool.pids
    verifier.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert verifier.score("wrong", "g") == 0.0  # new workers
    verifier.close()


def test_concurrent_callers_from_threads(hostile) -> None:
    results: dict[int, list[float]] = {}

    def call(i: int) -> None:
        answers = ["ok", "wrong"] * 5 + (["c_hang"] if i == 0 else [])
        results[i] = hostile.score_batch(answers, ["g"] * len(answers))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == [0, 1, 2, 3]
    assert results[0] == [1.0, 0.0] * 5 + [0.0]
    assert all(results[i] == [1.0, 0.0] * 5 for i in (1, 2, 3))


def test_a_verifier_is_picklable_with_fresh_state(hostile) -> None:
    hostile.score("ok", "g")
    copy = pickle.loads(pickle.dumps(hostile))
    assert copy.stats.total == 0 and copy._pool is None
    assert copy.timeout == hostile.timeout
    assert copy.score_batch(["ok", "wrong"], ["g", "g"]) == [1.0, 0.0]
    copy.close()


def test_startup_failure_is_reported_with_the_cause(hostile_module) -> None:
    with hostile_module.BrokenWarmupVerifier(workers=1) as verifier:
        with pytest.raises(WorkerStartupError, match="warmup exploded"):
            verifier.score("ok", "g")


def test_timeouts_are_not_cached_across_batches(hostile_module) -> None:
    # A timeout may be machine load rather than the answer: check the pair again next time.
    with hostile_module.HostileVerifier(timeout=TIMEOUT, workers=1) as verifier:
        assert statuses(verifier, ["spin", "spin"]) == [Status.TIMEOUT, Status.TIMEOUT]
        assert verifier.stats.cache_hits == 1  # duplicates within a batch run once
        assert statuses(verifier, ["spin", "ok"]) == [Status.TIMEOUT, Status.CORRECT]
        assert (verifier.stats.cache_hits, verifier.stats.timeout) == (1, 3)


def test_an_interrupted_batch_does_not_leak_results_into_the_next(hostile_module, monkeypatch) -> None:
    with hostile_module.HostileVerifier(workers=2, timeout=10.0, cache_size=0) as verifier:
        verifier.score("ok", "g")
        pool = verifier._pool

        def interrupted(batch) -> None:
            raise KeyboardInterrupt  # as if Ctrl-C arrived while both checks were running

        monkeypatch.setattr(pool, "_wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            verifier.score_batch(["ok", "ok"], ["g", "g"])
        monkeypatch.undo()
        assert verifier.score_batch(["wrong", "wrong", "half"], ["g"] * 3) == [0.0, 0.0, 0.5]


ORPHAN_SCRIPT = """
import os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
from hostile_verifiers import HostileVerifier
verifier = HostileVerifier(workers=2, timeout=60.0, cache_size=0)
verifier.score("ok", "g")
print(*verifier._pool.pids, flush=True)
threading.Thread(target=verifier.score_batch, args=(["c_hang"], ["g"]), daemon=True).start()
threading.Event().wait(0.5)  # let the hang reach one worker; the other stays idle
os.kill(os.getpid(), signal.SIGKILL)  # no cleanup code runs
"""


def test_workers_do_not_outlive_a_killed_parent(hostile_module) -> None:
    folder = os.path.dirname(hostile_module.__file__)
    parent = subprocess.run([sys.executable, "-c", ORPHAN_SCRIPT, folder], capture_output=True, text=True, timeout=60)
    pids = [int(pid) for pid in parent.stdout.split()]
    assert len(pids) == 2, parent.stderr
    deadline = time.monotonic() + 10.0  # idle: exits at once; busy: its watchdog polls each second
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _running(pid)}
        threading.Event().wait(0.1)
    assert not alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
