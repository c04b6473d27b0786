"""The single-process side of data parallelism: shares, gathers, sharding errors, per-rank data state."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import ggpo_lightning.rollouts.source as source_module
import ggpo_lightning.training.data as data_module
from ggpo_lightning.records.buffer import BehaviorBuffer
from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.core.distributed import all_gather_objects, interleave, rank_share, sum_across_ranks, world
from ggpo_lightning.models.sharding import copy_weights_, decoder_layers
from ggpo_lightning.core.distributed import _summed_metric
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine
from ggpo_lightning.rollouts.group import RolloutCounts
from ggpo_lightning.rollouts.source import SyncSource
from ggpo_lightning.testing import make_group
from ggpo_lightning.cli.train import check_devices


def test_rank_shares_are_disjoint_and_interleave_back_in_order():
    items = list(range(11))
    shares = [rank_share(items, r, 3) for r in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert interleave(shares) == items
    assert interleave([items]) == items


def test_one_process_collectives_return_their_input():
    assert world() == (0, 1)
    assert all_gather_objects({"a": 1}) == [{"a": 1}]
    values = torch.tensor([1.5, 2.0])
    assert sum_across_ranks(values) is values


def test_summed_and_averaged_metrics():
    assert _summed_metric("generated_samples") and _summed_metric("verifier/correct")
    assert not _summed_metric("verifier/accuracy") and not _summed_metric("loss") and not _summed_metric("reward")
    assert _summed_metric("verifier/unboxed") and not _summed_metric("verifier/unboxed_share")  # a count, a share
    assert _summed_metric("response_tokens") and _summed_metric("rollout_prompt_tokens")  # the step's, all ranks
    assert not _summed_metric("response_length") and not _summed_metric("rollout_verify_seconds")


def test_decoder_layers_are_found_by_class_name(tiny_lm):
    model, _ = tiny_lm
    layers = decoder_layers(model)
    assert len(layers) == model.config.num_hidden_layers
    assert {type(layer).__name__ for layer in layers} == {"LlamaDecoderLayer"}


def test_a_model_without_decoder_layers_cannot_be_sharded():
    with pytest.raises(ValueError, match="no recognizable.*trainer.strategy: ddp"):
        decoder_layers(nn.Sequential(nn.Linear(2, 2)))


def test_copy_weights_copies_everything_or_refuses(tiny_lm):
    model, _ = tiny_lm
    other = type(model)(model.config)
    copy_weights_(other, model)
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="different structure"):
        copy_weights_(nn.Linear(2, 2), model)
    with pytest.raises(ValueError, match="shapes"):
        copy_weights_(nn.Linear(2, 3), nn.Linear(2, 2))


def test_the_engine_loads_streamed_weights_and_names_what_is_wrong(tiny_lm):
    model, tokenizer = tiny_lm
    engine = HFGenerateEngine(model, tokenizer)
    trained = type(model)(model.config)
    engine.load_weights(iter(trained.state_dict().items()), version=5)
    assert engine.version == 5
    assert all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), trained.state_dict().values()))
    with pytest.raises(KeyError, match="no weight named 'nope'"):
        engine.load_weights(iter([("nope", torch.zeros(1))]), version=6)
    with pytest.raises(KeyError, match="missing from the stream"):
        engine.load_weights(iter(list(trained.state_dict().items())[:2]), version=6)


def _datamodule(tmp_path, **kwargs) -> PromptGroupDataModule:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+0=", "answer": str(i), "id": f"p{i}"}) + "\n"
                            for i in range(12)))
    return PromptGroupDataModule(str(path), **kwargs)


def _as_rank(monkeypatch, rank: int, world_size: int) -> None:
    """This process plays ``rank`` of ``world_size`` to the DataModule and the rollout source that shares the step's
    prompts (their cross-rank agreement stays a single process's: no collective)."""
    monkeypatch.setattr(data_module, "world", lambda: (rank, world_size))
    monkeypatch.setattr(source_module, "world", lambda: (rank, world_size))


def test_online_ranks_roll_out_disjoint_shares_of_each_step(tmp_path, monkeypatch):
    drawn = {}
    for rank in (0, 1):
        _as_rank(monkeypatch, rank, 2)
        dm = _datamodule(tmp_path, prompts_per_step=4, seed=3)
        dm.setup("fit")
        rolled = []

        def rollout(rows, rolled=rolled):
            rolled.append([r.id for r in rows])
            return [make_group([1], [[2], [3]], [1.0, 0.0], prompt_id=r.id) for r in rows]

        dm.trainer = SimpleNamespace(global_step=0)
        dm.source = SyncSource(FunctionRollout(rollout), dict)
        dm.source.connect(dm.step_prompts)
        drawn[rank] = [[g.prompt_id for g in dm.next_batch().groups] for _ in range(3)]
        assert drawn[rank] == rolled  # each rank trains on the groups it rolled out itself
    _as_rank(monkeypatch, 0, 1)
    one = _datamodule(tmp_path, prompts_per_step=4, seed=3)
    one.setup("fit")
    for step in range(3):
        assert not set(drawn[0][step]) & set(drawn[1][step]) and len(drawn[0][step]) == 2
        assert interleave([drawn[0][step], drawn[1][step]]) == [r.id for r in one.next_prompts(4)]


def test_prompts_per_step_must_split_evenly_over_ranks(tmp_path, monkeypatch):
    _as_rank(monkeypatch, 0, 4)
    with pytest.raises(ValueError, match=r"data.prompts_per_step \(6\) must be a multiple of the number of "
                                         r"processes \(4\)"):
        _datamodule(tmp_path, prompts_per_step=6).setup("fit")


def test_buffers_saved_by_two_ranks_resume_on_one_in_the_original_order(tmp_path, monkeypatch):
    groups = [make_group([1], [[2], [3]], [1.0, 0.0], prompt_id=f"g{i}") for i in range(5)]
    states = []
    for rank in (0, 1):
        buffer = BehaviorBuffer()
        buffer.add(rank_share(groups, rank, 2))
        states.append(buffer.state_dict())
    state = {"buffers": states, "order": [], "cursor": 0, "epoch": 0, "filled": True}
    _as_rank(monkeypatch, 0, 1)
    dm = _datamodule(tmp_path)
    dm.load_state_dict(state)
    assert [g.prompt_id for g in dm.buffer.groups()] == [f"g{i}" for i in range(5)]
    _as_rank(monkeypatch, 1, 2)  # the same world size: each rank its own buffer back
    dm.load_state_dict(state)
    assert [g.prompt_id for g in dm.buffer.groups()] == ["g1", "g3"]


def test_more_devices_than_the_machine_has_is_an_error_naming_the_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="trainer.devices asks for 8 GPU.*has 0; set --trainer.accelerator cpu"):
        check_devices("gpu", 8)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(ValueError, match="asks for 3 CPU cores.*set --trainer.devices 2"):
        check_devices("cpu", "3")
    check_devices("cpu", 2)
    check_devices("auto", "auto")


class _Mesh:
    def __init__(self, tensor_parallel: int) -> None:
        self.tensor_parallel = tensor_parallel

    def size(self) -> int:
        return 2 * self.tensor_parallel

    def __getitem__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(size=lambda: self.tensor_parallel if name == "tensor_parallel" else 2)


@pytest.mark.parametrize("lora,tensor_parallel,message", [
    (True, 1, "model.lora is not supported with ModelParallelStrategy.*use trainer.strategy: ddp"),
    (False, 2, "tensor parallelism is not supported; set tensor_parallel_size: 1 and data_parallel_size: 4"),
])
def test_fsdp_settings_it_cannot_train_are_errors(tiny_model_dir, lora, tensor_parallel, message):
    from lightning.pytorch.strategies import ModelParallelStrategy

    from ggpo_lightning.models.lora import LoraSettings
    from ggpo_lightning.training.module import GGPOModule

    module = GGPOModule(str(tiny_model_dir), verifier="numeric", lora=LoraSettings(r=2) if lora else None)
    module._trainer = SimpleNamespace(strategy=ModelParallelStrategy(), precision="32-true")
    module._device_mesh = _Mesh(tensor_parallel)
    with pytest.raises(ValueError, match=message):
        module.configure_model()


def test_checkpoints_keep_per_rank_state_and_old_ones_still_load(tiny_model_dir):
    from ggpo_lightning.training.module import GGPOModule

    module = GGPOModule(str(tiny_model_dir), verifier="numeric")
    module.group_rollout.generated_samples = 96
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    state = checkpoint["ggpo"]
    assert len(state["ranks"]) == 1 and state["ranks"][0]["generated_samples"] == 96
    expected = torch.rand(3)
    old = {k: v for k, v in state.items() if k != "ranks"}  # the single-process layout of earlier releases
    old.update(rng=state["ranks"][0]["rng"], generated_samples=96)
    module.group_rollout.generated_samples = 0
    module.on_load_checkpoint({"ggpo": old})
    assert module.generated_samples == 96 and torch.equal(torch.rand(3), expected)


def test_step_metrics_reduce_nan_aware_except_the_loss(monkeypatch):
    """Two ranks simulated: the other rank's values are added by the fake all-reduce."""
    import math

    from ggpo_lightning.core import distributed

    nan = float("nan")
    other = {"loss": 1.0, "reward": 0.5, "logratio_correct": -2.0, "logratio_wrong": nan, "generated_samples": 8.0}
    mine = {"loss": 3.0, "reward": 0.25, "logratio_correct": nan, "logratio_wrong": nan, "generated_samples": 8.0}
    names = list(mine)

    def fake_sum(values):  # [2M]: masked values, then presence flags, as the real call lays them out
        theirs = torch.tensor([other[n] for n in names])
        present = ~torch.isnan(theirs) | torch.tensor([n == "loss" for n in names])
        return values + torch.cat([torch.where(present, theirs, torch.zeros_like(theirs)), present.float()])

    monkeypatch.setattr(distributed, "world", lambda: (0, 2))
    monkeypatch.setattr(distributed, "sum_across_ranks", fake_sum)
    out = distributed.reduce_step_metrics({n: torch.tensor(v) for n, v in mine.items()}, torch.device("cpu"))
    assert out["loss"].item() == 2.0 and out["reward"].item() == 0.375
    assert out["logratio_correct"].item() == -2.0  # only the rank that had correct responses
    assert math.isnan(out["logratio_wrong"].item())  # none on either rank
    assert out["generated_samples"].item() == 16.0  # counts add up
    mine["loss"] = nan  # a NaN loss on one rank is NaN for all: every rank skips the step
    out = distributed.reduce_step_metrics({n: torch.tensor(v) for n, v in mine.items()}, torch.device("cpu"))
    assert math.isnan(out["loss"].item())


def _reduced_on_rank(rank: int) -> dict[str, float]:
    from ggpo_lightning.core import distributed

    mine = {"loss": [1.0, 3.0][rank], "staleness_max": [4.0, 1.0][rank], "response_length_max": [7.0, 9.0][rank],
            "generated_samples": 8.0}
    out = distributed.reduce_step_metrics({n: torch.tensor(v) for n, v in mine.items()}, torch.device("cpu"))
    return {n: v.item() for n, v in out.items()}


def test_maxima_are_the_largest_over_two_gloo_processes_the_rest_means_or_sums():
    from gloo_ranks import on_two_ranks

    for out in on_two_ranks(_reduced_on_rank):
        assert out == {"loss": 2.0, "staleness_max": 4.0, "response_length_max": 9.0, "generated_samples": 16.0}


class FunctionRollout:
    """A plain function as the rollout of a source (no engine, nothing counted)."""

    def __init__(self, rollout) -> None:
        self.rollout, self.engine = rollout, None

    def __call__(self, rows):
        return self.rollout(rows)

    def take_counts(self) -> RolloutCounts:
        return RolloutCounts()
