"""The asynchronous rollout producer on a fake engine: waits, versions, the staleness bound, hand-off, backlog."""

from __future__ import annotations

import random
import re
import threading
import time

import pytest
import torch

from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.rollouts.producer import ProducedBatch, RolloutProducer
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.config import RolloutConfig


class FakeEngine:
    """Holds one weight tensor; ``load_weights`` copies it in and records the version; generation is instant."""

    def __init__(self) -> None:
        self.version = 0
        self.weight = torch.zeros(1)
        self.loads: list[int] = []

    def generate(self, prompt_ids, n, sampling):
        raise AssertionError("FakeRollout stands for engine + verifier: the producer never calls generate")

    def load_weights(self, weights, version: int) -> None:
        self.weight.copy_(weights["w"])
        self.version = version
        self.loads.append(version)

    def close(self) -> None:
        """Nothing to release (what a source's close calls)."""


class FakeRollout:
    """Prompts in, one group per prompt out, tagged as GroupRollout tags them (the engine's version); records
    ``(prompt ids, version, the engine's weight)`` of every call. ``delay`` picks a generation time per call."""

    def __init__(self, engine: FakeEngine, delay=lambda: 0.0) -> None:
        self.engine, self.delay = engine, delay
        self.calls: list[tuple[list[str], int, float]] = []

    def __call__(self, rows):
        time.sleep(self.delay())  # stands for generation time
        self.calls.append(([r.id for r in rows], self.engine.version, float(self.engine.weight)))
        return [RolloutGroup(prompt_id=r.id, prompt=r.prompt, gold=r.gold, prompt_ids=[1], response_ids=[[2], [3]],
                             responses=["a", "b"], rewards=[0.0, 1.0], behavior_version=self.engine.version)
                for r in rows]


class Prompts:
    """An endless prompt stream, two prompts per step."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> list[PromptRow]:
        rows = [PromptRow(f"p{self.n + i}", f"{self.n + i}+0=", str(self.n + i)) for i in range(2)]
        self.n += 2
        return rows


def make(max_staleness: int, delay=lambda: 0.0) -> tuple[RolloutProducer, FakeEngine, FakeRollout]:
    engine = FakeEngine()
    rollout = FakeRollout(engine, delay)
    return RolloutProducer(rollout, engine, Prompts(), max_staleness), engine, rollout


def learn(producer: RolloutProducer, steps: int, sync_every: int, step_seconds=lambda: 0.0) -> list[ProducedBatch]:
    """The learner's loop: take the step's batch, "train" (``step_seconds``: a slow learner step), publish
    the weights (value = the version) every ``sync_every`` updates, as RolloutSync does."""
    taken = []
    producer.start(0)
    try:
        for step in range(steps):
            taken.append(producer.take(step))
            time.sleep(step_seconds())  # stands for the learner's forward, backward and update
            if (step + 1) % sync_every == 0:
                producer.publish({"w": torch.tensor([float(step + 1)])}, version=step + 1)
    finally:
        producer.stop()
    return taken


def test_the_learner_never_waits_when_the_producer_keeps_up():
    producer, _, _ = make(max_staleness=1)
    taken = learn(producer, steps=12, sync_every=1, step_seconds=lambda: 0.05)
    assert taken[0].wait_seconds >= 0  # the first batch is generated while the learner waits
    for step, batch in enumerate(taken[1:], start=1):
        # produced while the previous step trained: ready before the learner asked for it
        assert batch.ready_at <= batch.requested_at, (step, batch.ready_at, batch.requested_at)
        assert batch.wait_seconds == 0.0
        # keeping up, the producer waited at the gate for exactly the weights of the step before
        assert batch.version == step - 1


@pytest.mark.parametrize("sync_every,max_staleness", [(1, 0), (1, 2), (2, 1), (3, 4)])
def test_versions_and_staleness_are_recorded_exactly_and_bounded(sync_every, max_staleness):
    rng = random.Random(sync_every * 10 + max_staleness)
    # generation and learner steps of random lengths: sometimes the producer is ahead, sometimes behind
    producer, engine, rollout = make(max_staleness, delay=lambda: rng.choice([0.0, 0.0, 0.01]))
    taken = learn(producer, steps=16, sync_every=sync_every, step_seconds=lambda: rng.choice([0.0, 0.005]))
    generated = {tuple(ids): (version, weight) for ids, version, weight in rollout.calls}
    for step, batch in enumerate(taken):
        version, weight = generated[tuple(g.prompt_id for g in batch.groups)]
        assert batch.version == version and {g.behavior_version for g in batch.groups} == {version}
        assert weight == version  # the engine held the weights of the version it tagged the groups with
        assert version % sync_every == 0  # a sync point
        assert 0 <= step - version <= max_staleness, (step, version)
        assert batch.over_staleness == 0
    assert [ids for ids, _, _ in rollout.calls][:len(taken)] == [[g.prompt_id for g in b.groups] for b in taken]
    assert engine.loads == sorted(engine.loads)  # hand-offs loaded in order (a newer one may replace a pending one)


def test_a_group_past_the_bound_is_used_and_counted():
    # a checkpoint's batch made under max_staleness 3, resumed under 1 (the only way past the bound)
    producer, engine, _ = make(max_staleness=1)
    engine.version = 5
    old = ProducedBatch(FakeRollout(FakeEngine())(Prompts()()), version=2, ready_at=float("-inf"))
    for group in old.groups:
        group.behavior_version = 2
    producer.start(5, queued=[old])
    try:
        batch = producer.take(5)
        assert batch is old and batch.over_staleness == 2  # both groups, staleness 3 > 1: used, counted
        assert producer.take(6).over_staleness == 0
    finally:
        producer.stop()


def test_a_restored_backlog_comes_first_then_its_prompts_in_progress():
    producer, _, rollout = make(max_staleness=2)
    queued = ProducedBatch(FakeRollout(FakeEngine())([PromptRow("q", "q", "0")]), version=0, ready_at=float("-inf"))
    producer.start(0, queued=[queued], in_flight=[PromptRow("f", "f", "0")])
    try:
        assert [g.prompt_id for g in producer.take(0).groups] == ["q"]
        assert [g.prompt_id for g in producer.take(1).groups] == ["f"]
        assert [g.prompt_id for g in producer.take(2).groups] == ["p0", "p1"]
    finally:
        producer.stop()


def test_a_paused_producer_finishes_its_batch_and_starts_no_other():
    started, release = threading.Event(), threading.Event()
    engine = FakeEngine()

    def rollout(rows):
        started.set()
        release.wait()
        return FakeRollout(engine)(rows)

    producer = RolloutProducer(rollout, engine, Prompts(), max_staleness=3)
    producer.start(0)
    started.wait()
    seen, recorded, resume = [], threading.Event(), threading.Event()

    def evaluation():
        with producer.paused():
            seen.append(producer.backlog())
            recorded.set()
            resume.wait()

    pausing = threading.Thread(target=evaluation)
    pausing.start()
    release.set()  # the batch in progress may finish; paused() enters only once it has
    assert recorded.wait(timeout=30), "paused() never entered"
    queued, in_flight = seen[0]
    assert len(queued) == 1 and in_flight is None
    assert producer.backlog() == seen[0]  # nothing started while paused (the gate was open: max_staleness 3)
    resume.set()
    pausing.join()
    producer.stop()


def test_a_failing_rollout_is_raised_to_the_learner():
    engine = FakeEngine()

    def rollout(rows):
        raise OSError("verifier pool gone")

    producer = RolloutProducer(rollout, engine, Prompts(), max_staleness=1)
    producer.start(0)
    with pytest.raises(RuntimeError, match="rollout producer failed.*verifier pool gone"):
        producer.take(0)
    producer.stop()


def test_a_checkpoint_reads_the_newest_published_weights():
    producer, engine, _ = make(max_staleness=0)  # gate closed after batch 0 until version 1 is loaded
    engine.version = 0
    producer.start(0)
    producer.take(0)
    version, state = producer.engine_checkpoint(1, lambda step: {"w": engine.weight})
    assert version == 0 and torch.equal(state["w"], engine.weight) and state["w"] is not engine.weight  # a copy
    producer.publish({"w": torch.tensor([1.0])}, version=1)
    producer.take(1)  # produced after the hand-off was loaded
    version, state = producer.engine_checkpoint(1, lambda step: None)
    assert (version, state) == (1, None)  # equal to the learner's: rebuilt on resume
    producer.stop()


@pytest.mark.parametrize("settings,match", [
    (dict(schedule="async", max_staleness=-1), "model.rollout.max_staleness must be >= 0"),
    (dict(schedule="async", sync_every=4, max_staleness=2),
     r"max_staleness must be >= 0 and >= model.rollout.sync_every"),
    (dict(schedule="asynch"), "model.rollout.schedule must be one of"),
    (dict(schedule="sync", max_staleness=2), "model.rollout.max_staleness bounds the producer"),
])
def test_bad_async_settings_name_their_key(settings, match):
    errors = RolloutConfig(**settings).errors()
    assert len(errors) == 1 and re.search(match, errors[0]), errors


def test_the_default_bound_is_sync_every():
    assert RolloutConfig(schedule="async", sync_every=4).staleness_limit == 4
    assert RolloutConfig(schedule="async", sync_every=4, max_staleness=3).staleness_limit == 3
    assert RolloutConfig(schedule="async", sync_every=4, max_staleness=3).errors() == []


def test_the_producer_samples_under_the_autocast_of_the_thread_that_started_it():
    engine = FakeEngine()
    engine.model = torch.nn.Linear(2, 2)  # what tells the producer the device of an in-process engine
    seen = []

    def rollout(rows):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return FakeRollout(engine)(rows)

    producer = RolloutProducer(rollout, engine, Prompts(), max_staleness=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as Lightning's bf16-mixed around the training step
        producer.start(0)
    producer.take(0)
    producer.stop()
    assert seen == [(True, torch.bfloat16)]
