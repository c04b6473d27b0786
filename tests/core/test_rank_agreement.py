"""One outcome for every rank, on two real gloo processes: rank 0's decision or error reaches rank 1
(``from_rank0``), any rank's error reaches every rank (``failing_together``), as the same one line for a deliberate
stop and as a named bug otherwise."""

from __future__ import annotations

import pytest

from gloo_ranks import on_two_ranks
from ggpo_lightning.core.rank_agreement import Failure, failing_together, from_rank0, mirrored
from ggpo_lightning.records.errors import RunAborted


class ServersGone(RunAborted):
    status = "aborted-by-test"


def _outcome(action) -> tuple[str, str, str | None]:
    """What ``action()`` ended with: ``("ok", value, None)`` or ``(error type, message, status)``."""
    try:
        return "ok", action(), None
    except Exception as error:  # noqa: BLE001 - the test reads it
        return type(error).__name__, str(error), getattr(error, "status", None)


def _raise(error: Exception):
    raise error


def _failing_on(rank: int, failing_rank: int | None, error: Exception):
    with failing_together():
        if rank == failing_rank:
            raise error
    return "passed"


def _agreements(rank: int) -> dict[str, tuple]:
    return {
        "share": _outcome(lambda: from_rank0(lambda: [f"for rank {r}" for r in range(2)])),
        "stop": _outcome(lambda: from_rank0(lambda: _raise(ServersGone("no vLLM server usable for 5 s (a: refused)")))),
        "bug": _outcome(lambda: from_rank0(lambda: _raise(KeyError("weights")))),
        "miscount": _outcome(lambda: from_rank0(lambda: ["only one"])),
        "nothing failed": _outcome(lambda: _failing_on(rank, None, ValueError())),
        "rank 1 stops": _outcome(lambda: _failing_on(rank, 1, ServersGone("servers gone on rank 1"))),
        "rank 0 bug": _outcome(lambda: _failing_on(rank, 0, ZeroDivisionError("division by zero\nsecond line"))),
    }


def test_every_rank_gets_rank_0s_share_or_its_error():
    zero, one = on_two_ranks(_agreements)
    assert zero["share"] == ("ok", "for rank 0", None) and one["share"] == ("ok", "for rank 1", None)
    message = "no vLLM server usable for 5 s (a: refused)"
    assert zero["stop"] == ("ServersGone", message, "aborted-by-test")
    assert one["stop"] == ("RunAborted", message, "aborted-by-test")  # the same one line and status: same exit
    assert zero["bug"] == ("KeyError", "'weights'", None)
    assert one["bug"] == ("RuntimeError", "rank 0 failed (KeyError: 'weights'); this rank stops with it", None)
    assert zero["miscount"][0] == one["miscount"][0] == "RuntimeError" and "1 shares for 2 ranks" in one["miscount"][1]


def test_an_error_on_any_rank_stops_every_rank_at_the_same_point():
    zero, one = on_two_ranks(_agreements)
    assert zero["nothing failed"] == one["nothing failed"] == ("ok", "passed", None)
    assert one["rank 1 stops"] == ("ServersGone", "servers gone on rank 1", "aborted-by-test")
    assert zero["rank 1 stops"] == ("RunAborted", "servers gone on rank 1", "aborted-by-test")
    assert zero["rank 0 bug"][0] == "ZeroDivisionError"
    assert one["rank 0 bug"] == ("RuntimeError", "rank 0 failed (ZeroDivisionError: division by zero); this rank "
                                                 "stops with it", None)


@pytest.mark.parametrize("error, expected", [
    (ServersGone("gone"), (RunAborted, "gone", "aborted-by-test")),
    (ValueError(""), (RuntimeError, "rank 3 failed (ValueError: ); this rank stops with it", None)),
])
def test_a_mirror_keeps_a_stops_message_and_names_a_bugs_rank(error, expected):
    mirror = mirrored(Failure.of(error, 3))
    kind, message, status = expected
    assert type(mirror) is kind and str(mirror) == message and getattr(mirror, "status", None) == status


def test_on_one_process_nothing_is_sent_and_errors_pass_unchanged():
    assert from_rank0(lambda: ["mine"]) == "mine"
    with pytest.raises(ServersGone, match="gone"):
        from_rank0(lambda: _raise(ServersGone("gone")))
    with pytest.raises(KeyError):
        with failing_together():
            raise KeyError("x")
