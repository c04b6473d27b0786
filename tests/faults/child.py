"""``ggpo-train`` in a child process, optionally killed (SIGKILL, by itself) at a chosen point: fault injection.

    python child.py [kill_save=K:FRACTION] [enospc_save=K:BYTES] [kill_step=K] [kill_rollout=K]
        [signal_step=K:NAME] [signal_start=NAME] [record_batches=PATH] -- <ggpo-train arguments>

``kill_save``: during the K-th checkpoint save, after FRACTION of its bytes reached the
temporary file; ``enospc_save``: the K-th checkpoint save fails with "No space left on device"
(``OSError(ENOSPC)``) after BYTES bytes, and every later one at its first byte, as a full disk would;
``kill_step``: at the start of the training step at global step K;
``kill_rollout``: in the middle of the K-th rollout (after generation, before scoring);
``signal_step``: the process sends itself signal NAME (``SIGINT``, ``SIGTERM``) at the start
of the training step at global step K; ``signal_start``: signal NAME once Lightning has installed its own
signal handlers, before training starts (after the starting model's evaluation); ``record_batches``: each step's groups (prompt id, behavior version,
response ids) are appended to the JSONL file PATH as the learner receives them.
The kill lands where the plan says, not after a guessed delay.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import types


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_during_save(k: int, fraction: float) -> None:
    import torch

    import ggpo_lightning.training.checkpoint_io as checkpoint_io

    saves = 0

    def save(obj, f, *args, **kwargs):
        nonlocal saves
        saves += 1
        if saves < k:
            return torch.save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        torch.save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: int(len(data) * fraction)])
        f.flush()
        os.fsync(f.fileno())
        _die()

    checkpoint_io.torch = types.SimpleNamespace(save=save)


class _FullDisk(io.RawIOBase):
    """A file whose writes fail with ENOSPC once ``limit`` bytes went through."""

    def __init__(self, f, limit: int | None) -> None:
        self.f, self.limit, self.written = f, limit, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        room = max(0, self.limit - self.written)
        if len(data) > room:
            self.f.write(bytes(data[:room]))
            self.written += room
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.written += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _full_disk_from_save(k: int, limit: int) -> None:
    import contextlib

    import ggpo_lightning.training.checkpoint_io as checkpoint_io

    real_open = checkpoint_io.atomic_open
    saves = 0

    @contextlib.contextmanager
    def atomic_open(path, binary=False, before_replace=None):
        nonlocal saves
        saves += 1
        with real_open(path, binary, before_replace) as f:
            yield f if saves < k else _FullDisk(f, limit if saves == k else 0)

    checkpoint_io.atomic_open = atomic_open


def _at_step(k: int, action) -> None:
    from ggpo_lightning.training.module import GGPOModule

    step = GGPOModule.training_step

    def training_step(self, dataloader_iter):
        if self.global_step == k:
            action()
        return step(self, dataloader_iter)

    GGPOModule.training_step = training_step


def _kill_in_rollout(k: int) -> None:
    from ggpo_lightning.rollouts.group import GroupRollout

    calls = 0
    rollout = GroupRollout.__call__

    def call(self, rows):
        nonlocal calls
        calls += 1
        if calls == k:
            self.verifier.score_batch = lambda *a, **kw: _die()
        return rollout(self, rows)

    GroupRollout.__call__ = call


def _signal_at_start(name: str) -> None:
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    register = _SignalConnector.register_signal_handlers

    def register_then_signal(self):
        register(self)
        os.kill(os.getpid(), getattr(signal, name))

    _SignalConnector.register_signal_handlers = register_then_signal


def _record_batches(path: str) -> None:
    import json

    from ggpo_lightning.training.data import PromptGroupDataModule

    next_batch = PromptGroupDataModule.next_batch

    def record(self):
        batch = next_batch(self)  # a TrainingBatch since the rollout redesign
        with open(path, "a") as f:
            f.write(json.dumps({"step": self.trainer.global_step, "groups": [
                [g.prompt_id, g.behavior_version, g.response_ids] for g in batch.groups]}) + "\n")
        return batch

    PromptGroupDataModule.next_batch = record


def main() -> None:
    separator = sys.argv.index("--")
    plan = dict(option.split("=", 1) for option in sys.argv[1:separator])
    if "kill_save" in plan:
        k, fraction = plan["kill_save"].split(":")
        _kill_during_save(int(k), float(fraction))
    if "enospc_save" in plan:
        k, limit = plan["enospc_save"].split(":")
        _full_disk_from_save(int(k), int(limit))
    if "kill_step" in plan:
        _at_step(int(plan["kill_step"]), _die)
    if "signal_step" in plan:
        k, name = plan["signal_step"].split(":")
        _at_step(int(k), lambda: os.kill(os.getpid(), getattr(signal, name)))
    if "signal_start" in plan:
        _signal_at_start(plan["signal_start"])
    if "kill_rollout" in plan:
        _kill_in_rollout(int(plan["kill_rollout"]))
    if "record_batches" in plan:
        _record_batches(plan["record_batches"])
    from ggpo_lightning.cli.train import train_main

    sys.argv = ["ggpo-train", *sys.argv[separator + 1:]]
    train_main()


if __name__ == "__main__":
    main()
