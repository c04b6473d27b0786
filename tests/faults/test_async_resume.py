"""kill -9 of an asynchronous run: the batches produced ahead (and their versions) come back on resume."""

from __future__ import annotations

import json
import signal

import pytest

from faultkit import run, run_dir, train_args
from ggpo_lightning.models.checkpoint import read_checkpoint

BOUND = 3
ASYNC = ("--model.rollout.schedule", "async", "--model.rollout.max_staleness", str(BOUND))


def recorded(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # two ggpo-train processes: about 30 s
def test_kill_9_then_resume_restores_the_queued_batches_and_their_versions(tmp_path, fault_data, tiny_model_dir):
    async_engine = ASYNC
    killed = tmp_path / "killed.jsonl"
    code, out = run(train_args(tmp_path / "runs", tiny_model_dir, fault_data, *async_engine), "kill_step=3",
                    f"record_batches={killed}")
    assert code == -signal.SIGKILL, out
    last = run_dir(tmp_path / "runs") / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(last)
    assert checkpoint["global_step"] == 3
    backlog = checkpoint["ggpo"]["rollout"]["backlog"]
    queued = [[[g["prompt_id"], g["behavior_version"], g["response_ids"]] for g in b["groups"]]
              for b in backlog["queued"]]
    # the tiny model generates faster than it trains: the producer was ahead when the checkpoint was taken
    assert queued, backlog
    for batch, saved in zip(queued, backlog["queued"]):
        assert {version for _, version, _ in batch} == {saved["version"]}
        assert 0 <= 3 - saved["version"] <= BOUND
    trained = recorded(killed)
    assert [b["step"] for b in trained] == [0, 1, 2]
    assert all(0 <= b["step"] - version <= BOUND for b in trained for _, version, _ in b["groups"])

    resumed = tmp_path / "resumed.jsonl"
    code, out = run(train_args(tmp_path / "runs", tiny_model_dir, fault_data, *async_engine, "--ckpt_path", str(last),
                               "--trainer.max_steps", str(5 + BOUND)), f"record_batches={resumed}")
    assert code == 0, out
    after = recorded(resumed)
    # up to BOUND + 1 batches can be queued (a slow learner: the producer fills the gate); one step more follows them
    assert len(queued) <= BOUND + 1 and [b["step"] for b in after] == list(range(3, 5 + BOUND))
    # the batches trained on after the resume start with the checkpoint's queued ones: same prompts, same
    # responses, same behavior versions (not regenerated with the resumed weights) ...
    assert [b["groups"] for b in after[:len(queued)]] == queued
    # ... then the prompts of the batch that was in progress, regenerated
    following = [pid for pid, _, _ in after[len(queued)]["groups"]]
    if backlog["in_flight"] is not None:
        assert following == [row["id"] for row in backlog["in_flight"]]
    prompts_before = {pid for b in trained for pid, _, _ in b["groups"]}
    assert not prompts_before & {pid for b in after for pid, _, _ in b["groups"]}  # the prompt order continued
    assert all(0 <= b["step"] - version <= BOUND for b in after for _, version, _ in b["groups"])
