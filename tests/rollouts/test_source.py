"""SyncSource and AsyncSource run by the same tests against one fake engine: the interface covers every place the
schedule matters (next batch, publish, pause, checkpoint, close)."""

from __future__ import annotations

import time

import pytest

from fake_rollouts import FakeEngine, FakeRollout, Learner, Prompts
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.source import AsyncSource, RolloutBatch, SyncSource, make_source

SCHEDULES = ["sync", "async"]


def make(schedule: str, limit: int = 1):
    engine, learner = FakeEngine(), Learner()
    config = RolloutConfig(k=2, schedule=schedule, max_staleness=limit if schedule == "async" else None)
    source = make_source(config, FakeRollout(engine), learner.weights)
    source.connect(Prompts())
    return source, engine, learner


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_batches_follow_the_prompt_stream_and_carry_their_counts(schedule):
    source, _, _ = make(schedule)
    assert isinstance(source, {"sync": SyncSource, "async": AsyncSource}[schedule])
    try:
        batches = []
        for step in range(3):
            batches.append(source.next_batch(step))
            source.publish(version=step + 1)  # as the trainer syncs after every update
    finally:
        source.close()
    assert [[g.prompt_id for g in b.groups] for b in batches] == [["p1"], ["p2"], ["p3"]]
    assert all(b.counts.seconds == 1.0 and b.counts.tokens == 4 for b in batches)
    metrics = batches[0].metrics()
    assert metrics["rollout_seconds"] == 1.0 and metrics["rollout_tokens_per_s"] == 4.0
    assert ("rollout_wait_seconds" in metrics) == (schedule == "async")  # only a producer makes the learner wait


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_published_weights_reach_the_engine_with_their_version(schedule):
    source, engine, learner = make(schedule, limit=0)
    try:
        batch = source.next_batch(0)
        learner.w.fill_(7.0)
        source.publish(version=1)
        learner.w.fill_(8.0)  # a later update: the engine holds what was published, not the learner's tensor
        batch = source.next_batch(1)  # bound 0: this batch waits for version 1's weights
    finally:
        source.close()
    assert [g.behavior_version for g in batch.groups] == [1] and batch.groups[0].rewards[0] == 7.0
    assert engine.version == 1 and float(engine.weight) == 7.0


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_nothing_is_generated_while_paused(schedule):
    source, _, _ = make(schedule, limit=3)
    try:
        source.next_batch(0)
        with source.paused():
            calls = source.rollout.calls
            time.sleep(0.05)  # room for a producer that ignored the pause
            assert source.rollout.calls == calls
    finally:
        source.close()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_restored_source_trains_on_the_saved_backlog(schedule):
    source, _, _ = make(schedule, limit=2)
    try:
        source.next_batch(0)
        deadline = time.monotonic() + 30
        while schedule == "async" and len(source.producer.backlog()[0]) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # polling the producer's state, bounded
        with source.prompts_frozen():
            state = source.state_dict()
    finally:
        source.close()
    again, _, _ = make(schedule, limit=2)
    again.load_state_dict(state)
    try:
        resumed = [g.prompt_id for step in (1, 2) for g in again.next_batch(step).groups]
    finally:
        again.close()
    if schedule == "sync":
        assert state is None and resumed == ["p1", "p2"]  # nothing saved: rolled out anew from its own stream
    else:
        assert [b["groups"][0]["prompt_id"] for b in state["queued"]] == ["p2", "p3"] and resumed == ["p2", "p3"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_engine_checkpoint_restore_and_close(schedule):
    source, engine, learner = make(schedule)
    learner.w.fill_(3.0)
    source.publish(version=2)
    assert source.engine_checkpoint(2) == (2, None)  # synced at the checkpoint's step: rebuilt from the learner
    version, weights = source.engine_checkpoint(5)
    assert version == 2 and float(weights["w"]) == 3.0
    other, other_engine, _ = make(schedule)
    assert other.restore_engine(weights, version) is False and float(other_engine.weight) == 3.0
    assert other.restore_engine(None, 4) is True and other_engine.version == 4  # must be re-synced
    source.close()
    source.close()
    assert engine.closed == 2  # idempotent for the source; the engine's close is itself idempotent


def test_a_sync_run_warns_that_it_rolls_out_an_async_checkpoints_backlog_anew():
    source, _, _ = make("sync")
    with pytest.warns(UserWarning, match="1 batch\\(es\\) produced ahead .* rolls out anew"):
        source.load_state_dict({"queued": [{"groups": [], "version": 0}], "in_flight": None})


def test_offline_rollouts_go_in_chunks_and_count_once():
    source, _, _ = make("sync")
    rows = [PromptRow(f"q{i}", "1+1=", "2") for i in range(5)]
    batch = source.roll_out(rows, per_call=2)
    assert [g.prompt_id for g in batch.groups] == [r.id for r in rows] and source.rollout.calls == 3
    assert isinstance(batch, RolloutBatch) and batch.counts.seconds == 1.0
