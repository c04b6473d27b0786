"""The async schedule on two real gloo processes with a fake engine: rank 0 alone runs the producer, for the whole
step; each rank trains on its share of every batch, with counts whose reduction over ranks is the batch's; a producer
that fails stops both ranks with the same error; rank 0's backlog is the whole run's."""

from __future__ import annotations

import torch

from fake_rollouts import FakeEngine, FakeRollout, Learner
from ggpo_lightning.core.distributed import rank_share, reduce_step_metrics
from ggpo_lightning.records.errors import RunAborted
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.group import RolloutCounts
from ggpo_lightning.rollouts.source import AsyncSource
from ggpo_verifiers import VerifierStats
from gloo_ranks import on_two_ranks

PROMPTS_PER_STEP = 4


class StepPrompts:
    """Every rank's prompts of each step, in one order: ``s{n}-{i}``."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> list[PromptRow]:
        self.n += 1
        return [PromptRow(f"s{self.n}-{i}", "1+1=", "2") for i in range(PROMPTS_PER_STEP)]


class ServerLikeEngine(FakeEngine):
    """Takes weights while it generates, as vLLM servers do: every rank's publish loads it now (the servers' push is
    collective)."""

    loads_while_generating = True


class CountingRollout(FakeRollout):
    """Counts like a real rollout: tokens, seconds and the verifier's outcomes of the whole step; fails on call
    ``fail_on`` (1-based) with a deliberate stop, as when every server is gone."""

    def __init__(self, engine: FakeEngine, fail_on: int | None = None) -> None:
        super().__init__(engine)
        self.fail_on = fail_on

    def __call__(self, rows):
        if self.calls + 1 == self.fail_on:
            self.calls += 1
            raise RunAborted("no vLLM server usable for model.rollout.server_timeout=5 s (http://a: refused)")
        return super().__call__(rows)

    def take_counts(self) -> RolloutCounts:
        return RolloutCounts(seconds=2.0, tokens=40, verifier=VerifierStats(correct=3, wrong=5), prompt_tokens=16,
                             engine={"servers_alive": 2.0, "server_retries": 1.0})


def _train(rank: int, fail_on: int | None = None, steps: int = 3) -> dict:
    engine, learner = ServerLikeEngine(), Learner()
    rollout = CountingRollout(engine, fail_on)
    source = AsyncSource(rollout, learner.weights, 1, "vllm_server")
    source.connect(StepPrompts())
    taken, reduced, error = [], [], None
    try:
        for step in range(steps):
            batch = source.next_batch(step)
            taken.append([g.prompt_id for g in batch.groups])
            metrics = reduce_step_metrics({k: torch.tensor(v) for k, v in batch.metrics().items()},
                                          torch.device("cpu"))
            reduced.append({k: round(float(v), 6) for k, v in metrics.items() if k != "rollout_wait_seconds"})
            learner.w.fill_(step + 1.0)
            source.publish(version=step + 1)  # on every rank: collective on a real engine
    except RunAborted as stop:
        error = (type(stop).__name__, str(stop))
    finally:
        backlog = source.state_dict()
        source.close()
    return {"taken": taken, "reduced": reduced, "calls": rollout.calls, "error": error,
            "engine_version": engine.version, "backlog": [[g["prompt_id"] for g in b["groups"]] for b in backlog["queued"]]}


def _failing(rank: int) -> dict:
    return _train(rank, fail_on=2)


def test_rank_0_rolls_out_every_step_and_each_rank_trains_on_its_share():
    zero, one = on_two_ranks(_train)
    steps = [[f"s{n}-{i}" for i in range(PROMPTS_PER_STEP)] for n in (1, 2, 3)]
    assert zero["taken"] == [rank_share(step, 0, 2) for step in steps]
    assert one["taken"] == [rank_share(step, 1, 2) for step in steps]
    assert one["calls"] == 0 and zero["calls"] >= 3  # rank 1 never generates
    assert one["engine_version"] == zero["engine_version"] == 3  # every rank took part in every publish
    # the reduced metrics are the whole batch's, as on one process, and the same on both ranks
    assert zero["reduced"] == one["reduced"]
    first = zero["reduced"][0]
    assert first["verifier/total"] == 8 and first["verifier/correct"] == 3 and first["verifier/accuracy"] == 0.375
    assert first["rollout_seconds"] == 2.0 and first["rollout_tokens_per_s"] == 20.0
    assert first["rollout_prompt_tokens"] == 16 and first["servers_alive"] == 2.0 and first["server_retries"] == 1.0
    # rank 0's backlog holds whole steps (a checkpoint of one process resumes on several and back); rank 1's nothing
    assert all(len(batch) == PROMPTS_PER_STEP for batch in zero["backlog"]) and one["backlog"] == []


def test_a_failed_producer_stops_both_ranks_with_its_one_line():
    zero, one = on_two_ranks(_failing)
    message = "no vLLM server usable for model.rollout.server_timeout=5 s (http://a: refused)"
    assert zero["error"] == ("RunAborted", message) and one["error"] == ("RunAborted", message)
    assert len(zero["taken"]) == len(one["taken"]) == 1  # both stopped at the same step
