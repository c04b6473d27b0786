"""A fleet server's states and transitions (no vLLM, no HTTP): requests go to serving servers only, a failure takes a
server out until it answers and is re-synced, and a transition the table does not name is refused."""

from __future__ import annotations

import pytest

from ggpo_lightning.rollouts.fleet.server_state import TRANSITIONS, FleetServer, ServerState

S = ServerState


def server(state: ServerState = S.UNSYNCED) -> FleetServer:
    return FleetServer("http://127.0.0.1:1", state=state)


def test_a_new_server_serves_after_its_first_push_and_not_during_it():
    s = server()
    assert (s.state, s.usable, s.answering, s.in_fleet) == (S.UNSYNCED, False, True, True)
    s.begin_push()
    assert (s.state, s.usable, s.in_fleet) == (S.PUSHING, False, True)
    assert s.pushed() is False  # a first push is no re-sync
    assert (s.state, s.usable) == (S.SERVING, True)
    s.begin_push()  # the next push takes it off requests again
    assert not s.usable and s.pushed() is False and s.usable


def test_a_failed_server_is_out_until_it_answers_then_used_after_a_re_sync():
    s = server(S.SERVING)
    assert s.failed("ConnectionError: refused") is True  # news: named once in the log
    assert (s.state, s.usable, s.answering, s.in_fleet, s.last_error) == (
        S.OUT, False, False, False, "ConnectionError: refused")
    assert s.failed("again") is False  # still out: not news
    s.answers_again()
    assert (s.state, s.usable, s.answering, s.in_fleet) == (S.BACK, False, True, False)
    s.begin_push()
    assert s.state is S.RESYNCING and not s.in_fleet
    assert s.failed("its re-sync failed too") is False  # it had not come back into the fleet yet
    s.answers_again()
    s.begin_push()
    assert s.pushed() is True  # counted as a re-sync
    assert (s.state, s.usable, s.in_fleet, s.last_error) == (S.SERVING, True, True, None)


def test_a_push_that_ends_after_a_request_took_its_server_out_leaves_it_out():
    s = server(S.SERVING)
    s.begin_push()
    s.failed("a request in flight failed")
    assert s.pushed() is False and s.state is S.OUT and s.last_error == "a request in flight failed"


def test_a_changed_base_unsyncs_the_serving_servers_only():
    states = [S.SERVING, S.UNSYNCED, S.OUT, S.BACK]
    servers = [server(state) for state in states]
    for s in servers:
        s.weights_changed()
    assert [s.state for s in servers] == [S.UNSYNCED, S.UNSYNCED, S.OUT, S.BACK]


def test_another_rank_follows_rank_0s_push_outcome_whatever_it_saw_itself():
    """Rank 0 is the one that pushed: a server it reached serves on every rank (even one this rank saw fail: its
    failure predates the push), a server it did not reach is out on every rank, with rank 0's error."""
    states = (S.UNSYNCED, S.SERVING, S.BACK, S.OUT)
    reached = [server(state) for state in states]
    for s in reached:
        s.last_error = "an old error"
        s.follow_rank0(True, None)
    assert [s.state for s in reached] == [S.SERVING] * 4 and all(s.last_error is None for s in reached)
    lost = [server(state) for state in states]
    for s in lost:
        s.follow_rank0(False, "ConnectionError: refused")
    assert [s.state for s in lost] == [S.OUT] * 4 and {s.last_error for s in lost} == {"ConnectionError: refused"}


@pytest.mark.parametrize("state, transition", [(S.OUT, "begin_push"), (S.SERVING, "answers_again"),
                                               (S.UNSYNCED, "pushed"), (S.PUSHING, "weights_changed")])
def test_a_transition_the_table_does_not_name_is_a_bug(state, transition):
    s = server(state)
    with pytest.raises(RuntimeError, match=f"no transition {transition!r} from {state.value!r}"):
        getattr(s, transition)()
    assert s.state is state


def test_every_state_is_reachable_and_every_transition_leads_to_a_state():
    reached, frontier = {S.UNSYNCED}, [S.UNSYNCED]
    while frontier:
        state = frontier.pop()
        for table in TRANSITIONS.values():
            target = table.get(state)
            if target is not None and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(S)


def test_each_time_a_server_is_taken_out_its_epoch_grows():
    s = server(S.SERVING)
    s.failed("a request failed")
    s.answers_again()
    s.begin_push()
    s.failed("its re-sync failed")
    assert s.epoch == 2


def test_a_push_that_ends_after_its_server_was_taken_out_and_answered_again_leaves_it_back():
    s = server(S.SERVING)
    s.begin_push()
    s.failed("a request in flight failed")
    s.answers_again()  # probed while the push still ran
    assert s.pushed() is False and s.state is S.BACK and not s.usable
