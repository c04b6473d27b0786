"""A fake rollout engine and the fakes around it, for tests of the rollout source and its owner: the whole engine
protocol on one weight tensor, a rollout that stands for engine + verifier, an endless prompt stream."""

from __future__ import annotations

import torch

from ggpo_lightning.records.buffer import RolloutGroup
from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.group import RolloutCounts


class FakeEngine:
    """The whole engine protocol on one weight tensor; records loads and closes."""

    def __init__(self) -> None:
        self.version, self.weight, self.closed = 0, torch.zeros(1), 0

    def generate(self, prompt_ids, n, sampling):
        raise AssertionError("the fake rollout stands for engine + verifier")

    def load_weights(self, weights, version: int) -> None:
        self.weight.copy_(dict(weights)["w"])
        self.version = version

    def to(self, device):
        return self

    def unshare(self) -> None:
        """Never shares a learner's tensors."""

    def state_dict(self, step: int):
        return None if self.version == step else {"w": self.weight.clone()}

    def load_state_dict(self, state, version: int) -> bool:
        self.version = version
        if state is not None:
            self.weight.copy_(state["w"])
        return state is None

    def close(self) -> None:
        self.closed += 1


class FakeRollout:
    """One group per prompt, tagged with the engine's version and weight; counts one second per call."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine, self.calls = engine, 0

    def __call__(self, rows):
        self.calls += 1
        return [RolloutGroup(prompt_id=r.id, prompt=r.prompt, gold=r.gold, prompt_ids=[1], response_ids=[[2], [3]],
                             responses=["a", "b"], rewards=[float(self.engine.weight), 1.0],
                             behavior_version=self.engine.version) for r in rows]

    def take_counts(self) -> RolloutCounts:
        return RolloutCounts(seconds=1.0, tokens=4)


class Prompts:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> list[PromptRow]:
        self.n += 1
        return [PromptRow(f"p{self.n}", "1+1=", "2")]


class Learner:
    def __init__(self) -> None:
        self.w = torch.zeros(1)

    def weights(self):
        return {"w": self.w}
