"""The rollout source's one owner (RolloutLoop): backlog and prompt stream saved together, the engine a resume
starts from, and exactly one close on every way a run ends."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from fake_rollouts import FakeEngine, FakeRollout, Learner
from ggpo_lightning.models.checkpoint import CHECKPOINT_KEY, learner_weights, read_checkpoint
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.rollouts.protocol import weight_pairs
from ggpo_lightning.training.callbacks import RunGuard, RunInterrupted
from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.training.rollout_loop import RolloutLoop
from training_runs import fit, fit_resumable, make_data, make_module

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def test_the_backlog_and_the_prompt_position_are_saved_together_and_a_resume_trains_on_the_backlog_first(data_dir,
                                                                                                      tmp_path):
    def connected() -> tuple[RolloutLoop, PromptGroupDataModule]:
        dm = PromptGroupDataModule(str(data_dir / "train.jsonl"), prompts_per_step=2)
        dm.load_rows()
        dm.trainer = SimpleNamespace(global_step=0)
        loop = RolloutLoop(RolloutConfig(k=2, schedule="async", max_staleness=2), FakeRollout(FakeEngine()),
                           Learner().weights)
        loop.setup(SimpleNamespace(datamodule=dm, log_dir=str(tmp_path), global_step=0), None, "fit")
        assert dm.source is loop.source
        return loop, dm

    first, first_dm = connected()
    trained = [[g.prompt_id for g in first_dm.next_batch().groups]]
    first_dm.trainer.global_step = 1
    deadline = time.monotonic() + 30
    while len(first.source.producer.backlog()[0]) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)  # polling for the producer's state, not a guess of its timing
    state = first.checkpoint_state(step=1)
    queued = [[g["prompt_id"] for g in b["groups"]] for b in state.backlog["queued"]]
    assert len(queued) == 2 and state.backlog["in_flight"] is None  # the gate: steps 1 and 2 at version 0, no more
    assert state.prompts["cursor"] == 6  # the stream stands after the prompts of the backlog (3 steps x 2)
    assert "order" not in first_dm.state_dict()  # one place for the position: the rollout state
    first.close()

    second, second_dm = connected()
    second.restore(state)
    second_dm.trainer.global_step = 1
    resumed = [[g.prompt_id for g in second_dm.next_batch().groups] for _ in range(3)]
    second.close()
    assert resumed[:2] == queued  # the checkpoint's batches, not regenerated
    order = [row.id for row in connected()[1].next_prompts(8)]  # the seeded prompt order, uninterrupted
    assert sum(trained + resumed, []) == order


def test_a_schedule_refuses_a_run_it_does_not_take_at_setup(data_dir):
    dm = PromptGroupDataModule(str(data_dir / "train.jsonl"), mode="offline")
    loop = RolloutLoop(RolloutConfig(k=2, schedule="async"), FakeRollout(FakeEngine()), Learner().weights)
    with pytest.raises(ValueError, match="model.rollout.schedule: async needs data.mode: online"):
        loop.setup(SimpleNamespace(datamodule=dm), None, "fit")
    assert dm.source is None


class _Stop(L.Callback):
    """Ends the run after step 2: an exception, or SIGINT to this process (``RunGuard`` turns it into
    ``RunInterrupted`` once the step is over)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == 2 and self.how == "exception":
            raise RuntimeError("a failure in the middle of the run")
        if trainer.global_step == 2 and self.how == "sigint":
            os.kill(os.getpid(), signal.SIGINT)


def _generation() -> set:
    """The producer threads and child processes alive now."""
    threads = {t for t in threading.enumerate() if t.name == "ggpo-rollout-producer" and t.is_alive()}
    return threads | set(multiprocessing.active_children())


@pytest.mark.parametrize("ending", ["completed", "exception", "sigint"])
def test_the_source_is_closed_exactly_once_however_the_run_ends(tiny_model_dir, data_dir, tmp_path, ending):
    """Async with the generation process: a producer thread and a child process, both gone after the run."""
    torch.manual_seed(0)
    module = make_module(tiny_model_dir, rollout=RolloutConfig(k=3, schedule="async", async_worker="process",
                                                               sampling=SamplingConfig(max_new_tokens=3)))
    source = module.rollout_loop.source
    before = _generation()
    closes = []
    close = source.close
    source.close = lambda: closes.append({x.name for x in _generation() - before}) or close()
    callbacks = [RunGuard()] if ending == "sigint" else []
    expected = {"completed": None, "exception": RuntimeError, "sigint": RunInterrupted}[ending]
    previous = signal.getsignal(signal.SIGINT)
    try:
        if expected is None:
            fit(module, make_data(data_dir), steps=4, tmp_path=tmp_path)
        else:
            with pytest.raises(expected):
                fit(module, make_data(data_dir), steps=4, callbacks=[*callbacks, _Stop(ending)], tmp_path=tmp_path,
                    enable_checkpointing=ending == "sigint")  # RunGuard is a checkpoint callback
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(closes) == 1
    assert closes[0] == {"ggpo-rollout-producer", "ggpo-generate"}  # they ran until the close
    assert _generation() <= before
    if ending == "sigint":  # the checkpoint RunGuard saved after the close holds the backlog
        saved = read_checkpoint(tmp_path / "checkpoints" / "interrupted.ckpt")
        assert saved["global_step"] == 2 and saved[CHECKPOINT_KEY]["rollout"]["backlog"] is not None


class _FirstRollout(L.Callback):
    """Records the engine's version and weights when the first group after the start is generated."""

    def __init__(self) -> None:
        self.seen: tuple[int, dict[str, torch.Tensor]] | None = None

    def on_train_start(self, trainer, module) -> None:
        generate = module.engine.generate

        def recording(*args, **kwargs):
            if self.seen is None:
                engine = module.engine
                self.seen = engine.version, {k: v.clone() for k, v in engine.model.state_dict().items()}
            return generate(*args, **kwargs)

        module.engine.generate = recording


@pytest.mark.parametrize("checkpoint_at", ["schema3-asset", 3, 4])
def test_after_a_resume_the_first_rollout_uses_the_checkpoints_engine(tiny_model_dir, data_dir, tmp_path,
                                                                      checkpoint_at):
    """Sync every 2: at step 3 the checkpoint holds the stale engine (version 2); at step 4 the engine was the
    learner, not saved again, and is re-synced from the restored learner (version 4). The asset was written at
    commit 7d63ac6 (schema 3, the engine at the top of the run state)."""
    def module():
        torch.manual_seed(0)
        made = make_module(tiny_model_dir, rollout=RolloutConfig(k=3, sync_every=2,
                                                                 sampling=SamplingConfig(max_new_tokens=3)),
                           ref_refresh_every=3)
        made.resume_mismatch_ok = True  # the asset was written with other paths to the same model and data
        return made

    if checkpoint_at == "schema3-asset":
        path = ASSETS / "schema3-7d63ac6" / "sync_step3.ckpt"
    else:
        fit_resumable(module(), data_dir, tmp_path, 4, save_at=checkpoint_at)
        path = tmp_path / "ckpt" / f"epoch=0-step={checkpoint_at}.ckpt"
    saved = read_checkpoint(path)
    state = saved[CHECKPOINT_KEY]
    version, engine = (state["engine_version"], state["engine_state"]) if state["schema"] == 3 else (
        state["rollout"]["engine_version"], state["rollout"]["engine_state"])
    step = saved["global_step"]
    assert version == step - step % 2 and (engine is None) == (step % 2 == 0)
    expected = learner_weights(saved) if engine is None else engine
    first = _FirstRollout()
    fit(module(), make_data(data_dir, buffer_capacity=50, buffer_draw="uniform"), step + 1, callbacks=[first],
        tmp_path=tmp_path / "resumed", ckpt_path=str(path))
    assert first.seen is not None and first.seen[0] == version
    for name, value in first.seen[1].items():
        assert torch.equal(value, expected[name]), name


class _Pushes:
    """Records every push to the module's engine, marked as one that samples only with pushed weights (as vLLM
    servers are): its version, the device of what it was given, and whether the strategy had set the run up by then
    (it moves the learner to its device and makes the optimizers: ``trainer.optimizers`` is empty before)."""

    def __init__(self, module) -> None:
        self.calls: list[tuple[int, torch.device, bool]] = []
        engine, load = module.engine, module.engine.load_weights
        engine.sync_before_rollouts = True

        def recording(weights, version):
            _, first = next(iter(weight_pairs(weights)))
            self.calls.append((version, first.device, bool(module.trainer.optimizers)))
            return load(weights, version=version)

        engine.load_weights = recording


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("gpu", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the GPU case: benchmarks/gpu_smoke.sh runs it on a GPU machine"))])
def test_the_first_push_comes_after_the_strategy_placed_the_learner_and_a_resume_pushes_once(tiny_model_dir, data_dir,
                                                                                              tmp_path, accelerator):
    """Lightning calls ``setup`` before the strategy moves the learner to its device (vLLM's NCCL engine then got CPU
    tensors and asserted): the first push is at train start, after the strategy; a resume pushes once, tagged with
    the checkpoint's step (it pushed at setup, tagged 0, then again at train start). On CPU the strategy's mark is the
    optimizers it makes; on a GPU the pushed tensors' device is the learner's too."""
    def module():
        torch.manual_seed(0)
        return make_module(tiny_model_dir, rollout=RolloutConfig(k=3, sync_every=2,
                                                                 sampling=SamplingConfig(max_new_tokens=3)))

    first = module()
    pushes = _Pushes(first)
    fit_resumable(first, data_dir, tmp_path, 3, save_at=3, accelerator=accelerator)
    assert first.device.type == ("cuda" if accelerator == "gpu" else "cpu")
    assert pushes.calls[0] == (0, first.device, True)
    assert [version for version, *_ in pushes.calls] == [0, 2]  # at the start, then every sync_every = 2 updates
    resumed = module()
    pushes = _Pushes(resumed)
    fit_resumable(resumed, data_dir, tmp_path / "resumed", 4, ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=3.ckpt"),
                  accelerator=accelerator)
    assert pushes.calls == [(3, resumed.device, True), (4, resumed.device, True)]  # once at the start, then step 4
