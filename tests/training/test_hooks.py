"""NanGuard: non-finite steps counted, a streak stops the run with a checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

from ggpo_lightning.training.hooks import NanGuard


def test_a_streak_of_non_finite_losses_saves_and_stops_and_a_finite_step_resets_it(tmp_path):
    saved = []
    trainer = SimpleNamespace(global_step=7, log_dir=str(tmp_path), default_root_dir="unused", should_stop=False,
                              save_checkpoint=saved.append)
    guard = NanGuard(max_in_a_row=2)
    assert guard.skip(trainer) == 1 and not trainer.should_stop
    guard.passed()  # a finite step between: the streak starts again
    assert guard.skip(trainer) == 2 and not trainer.should_stop and not saved
    assert guard.skip(trainer) == 3 and trainer.should_stop
    assert saved == [tmp_path / "nan-stop.ckpt"] and guard.total == 3
