"""Experiment grids: every combination of named settings, times seeds, one ``ggpo-train`` run each.

A grid file (YAML) names a base recipe, the axes, the seeds and where runs go::

    base: ../quickstart.yaml          # relative to the grid file
    out: runs/grid                    # relative to the working directory
    seeds: [0, 1, 2]
    overrides: {trainer.max_steps: 300}        # applied to every run
    axes:
      objective:
        ggpo: {model.objective.name: ggpo}
        grpo: {model.objective.name: grpo}
      setting:
        sync1: {model.rollout.sync_every: 1}
        offline: {data.mode: offline}

Cells trimmed on purpose are listed under ``exclude``: each entry names axis values (and seeds), one or a list per
axis, and the runs matching all of them are not part of the grid::

    exclude:
      - {objective: grpo-opsm, seed: [1, 2]}   # identical to grpo on seed 0: one seed is enough

A grid that varies another one names it under ``include`` (relative to the grid file) and states only what
differs. The included grid's ``base``, ``out`` and ``seeds`` hold unless this file gives its own; its ``overrides``
hold, this file's replacing them key by key; its ``axes`` hold, each axis this file gives replacing the included
grid's axis of that name (in its place, so run names keep their order). In this file's axes a value given without
overrides (``oapl:``), or an axis given as a list of names, is the included grid's value of that name. Its
``exclude`` does not carry over (the cells differ)::

    include: family-grid.yaml                  # base, out, seeds, overrides and the objectives' settings
    overrides: {trainer.max_steps: 300}
    axes:
      setting:
        offline300: {data.mode: offline}
      objective: [oapl, m2po, vespo]           # as family-grid.yaml defines them

A string value may hold ``{seed}``, replaced by the run's seed: e.g. a tiny model and warm-up of its own per
seed (``model.model_name_or_path: runs/grid/tiny-model-seed{seed}``, ``tiny_model.seed: "{seed}"``).

Each run is ``ggpo-train --config BASE --<key> <value> ... --seed_everything SEED`` in a
subprocess, logged to ``OUT/<objective>-<setting>-seed<SEED>/`` (axis values in axis
order) with ``grid_run.json`` holding its labels and ``train.log`` its output. A run
whose ``summary.json`` says it completed is done and skipped; one that ran into an error of its own
(``aborted``: a crash, the verifier's health check) is reported failed again, not rerun (its folder says why;
delete it to run it again); an unfinished one (no summary, or ``interrupted`` by a signal) starts
over (its metrics would otherwise have a gap: Lightning's CSV logger truncates
``metrics.csv`` on resume). So ``ggpo sweep GRID.yaml`` can be interrupted and started
again, losing at most the run in progress.

SIGINT (Ctrl-C) or SIGTERM (``kill``, a scheduler's time limit) to the sweep is passed on to the run in progress,
which finishes its step and saves (``ggpo-train``'s run guard; a second signal stops it at once); the sweep waits
for it and stops with :class:`SweepStopped` instead of starting the next run. The run is started in a session of
its own, so a terminal's Ctrl-C reaches it once, through the sweep, and it never outlives the sweep to race a
restarted one over the same folder.
"""

from __future__ import annotations

import itertools
import json
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ggpo_lightning.records.atomic import atomic_write_text

__all__ = ["Grid", "GridRun", "SweepStopped", "load_grid", "run_grid"]

RUN_LABELS = "grid_run.json"


@dataclass(frozen=True)
class GridRun:
    """One cell of the grid for one seed."""

    name: str
    labels: dict[str, Any]
    """Axis name -> value name, plus ``seed``."""
    overrides: dict[str, Any]
    """Dotted ggpo-train keys -> values (grid-wide, then each axis value's)."""


@dataclass(frozen=True)
class Grid:
    base: Path
    out: Path
    runs: list[GridRun]


def _fail(path: Path, message: str) -> None:
    raise ValueError(f"{path}: {message}")


_FIELDS = ("include", "base", "out", "seeds", "axes", "overrides", "exclude")


def _read_spec(path: Path, including: tuple[Path, ...]) -> dict[str, Any]:
    """The grid file's fields, each checked, ``base`` resolved, with the grid it includes filled in (the module's
    docstring says how); ``including`` is the chain of files that led here (an include cycle is an error)."""
    if not path.is_file():
        if including:
            _fail(including[-1], f"include: grid file {path} does not exist")
        raise FileNotFoundError(f"grid file {path} does not exist")
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(spec, dict):
        _fail(path, "expected a mapping with base, out, seeds and axes")
    unknown = set(spec) - set(_FIELDS)
    if unknown:
        _fail(path, f"unknown field(s) {sorted(unknown)}; allowed: {', '.join(_FIELDS)}")
    if "base" in spec:
        base = (path.parent / str(spec["base"])).resolve()
        if not base.is_file():
            _fail(path, f"base recipe {spec['base']!r} not found (looked at {base})")
        spec["base"] = base
    seeds = spec.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        _fail(path, f"seeds must be a non-empty list of integers, got {seeds!r}")
    if not isinstance(spec.get("overrides") or {}, dict):
        _fail(path, f"overrides must map dotted keys to values, got {spec['overrides']!r}")
    included, include = None, spec.pop("include", None)
    if include is not None:
        target = (path.parent / str(include)).resolve()
        if target in (*including, path.resolve()):
            _fail(path, f"include: {target} includes this file again (a cycle)")
        included = _read_spec(target, (*including, path.resolve()))
    if "axes" in spec:
        spec["axes"] = _axes(path, spec["axes"], included)
    if included is None:
        return spec
    merged = {key: value for key, value in included.items() if key != "exclude"}
    merged.update({key: value for key, value in spec.items() if key not in ("overrides", "axes")})
    merged["overrides"] = {**(included.get("overrides") or {}), **(spec.get("overrides") or {})}
    merged["axes"] = {**included.get("axes", {}), **spec.get("axes", {})}  # a replaced axis keeps its place
    return merged


def _axes(path: Path, axes: Any, included: dict[str, Any] | None) -> dict[str, dict[str, dict]]:
    """``axes`` checked, each value given by name only (``name:`` or a list of names) taken from ``included``."""
    if not (isinstance(axes, dict) and axes):
        _fail(path, "axes must map axis names to {value name: {dotted key: value}}")
    if "seed" in axes:
        _fail(path, "axes.seed: 'seed' is the seeds' label; give the seeds as seeds: [...]")
    checked = {}
    for axis, values in axes.items():
        if isinstance(values, list) and included is not None:
            values = dict.fromkeys(values)
        if not (isinstance(values, dict) and values):
            _fail(path, f"axes.{axis} must map value names to override mappings")
        checked[axis] = {}
        for value, overrides in values.items():
            if overrides is None and included is not None:
                known = included.get("axes", {}).get(axis, {})
                if value not in known:
                    _fail(path, f"axes.{axis}.{value}: the included grid has no such value; "
                                f"its axes.{axis}: {', '.join(known) or 'none'}")
                overrides = known[value]
            if not isinstance(overrides, dict):
                _fail(path, f"axes.{axis}.{value} must map dotted keys to values, got {overrides!r}")
            checked[axis][value] = overrides
    return checked


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file (and the grid it includes); errors name the file and the field."""
    path = Path(path)
    spec = _read_spec(path, ())
    for field in ("base", "out", "axes"):
        if field not in spec:
            _fail(path, f"missing field {field!r}")
    base = spec["base"]
    seeds = spec.get("seeds", [0])
    common = spec.get("overrides") or {}
    axes = spec["axes"]
    excluded = _excluded(path, spec.get("exclude") or [], {**{axis: list(values) for axis, values in axes.items()},
                                                            "seed": seeds})
    runs = []
    for combo in itertools.product(*(list(values.items()) for values in axes.values())):
        for seed in seeds:
            cell = {axis: value for axis, (value, _) in zip(axes, combo)}
            labels = {**cell, "seed": seed}
            if any(all(labels[key] in names for key, names in entry.items()) for entry in excluded):
                continue
            overrides = dict(common)
            for _, values in combo:
                overrides.update(values)
            overrides = {key: _with_seed(value, seed) for key, value in overrides.items()}
            runs.append(GridRun("-".join(cell.values()) + f"-seed{seed}", labels, overrides))
    return Grid(base=base, out=Path(spec["out"]), runs=runs)


def _excluded(path: Path, entries: Any, choices: dict[str, list]) -> list[dict[str, list]]:
    """The ``exclude`` entries as {axis or ``seed``: the names it matches}, each name checked against ``choices``."""
    if not isinstance(entries, list):
        _fail(path, f"exclude must be a list of {{axis: value or [values]}} mappings, got {entries!r}")
    checked = []
    for index, entry in enumerate(entries):
        if not (isinstance(entry, dict) and entry):
            _fail(path, f"exclude[{index}] must map axis names (or seed) to a value or a list, got {entry!r}")
        entry = {key: names if isinstance(names, list) else [names] for key, names in entry.items()}
        for key, names in entry.items():
            if key not in choices:
                _fail(path, f"exclude[{index}]: {key!r} is not an axis; the axes: {', '.join(choices)}")
            for name in names:
                if name not in choices[key]:
                    _fail(path, f"exclude[{index}].{key}: {name!r} is not one of {choices[key]}")
        checked.append(entry)
    return checked


def _with_seed(value: Any, seed: int) -> Any:
    """``value`` with ``{seed}`` replaced by ``seed`` in strings, also inside lists; other values as they are."""
    if isinstance(value, str):
        return value.replace("{seed}", str(seed))
    if isinstance(value, list):
        return [_with_seed(item, seed) for item in value]
    return value


def _argv(grid: Grid, run: GridRun) -> list[str]:
    argv = [sys.executable, "-m", "ggpo_lightning.cli.train", "--config", str(grid.base)]
    for key, value in run.overrides.items():
        argv += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]  # true, null, 0.2
    argv += [
        "--seed_everything", str(run.labels["seed"]),
        "--trainer.logger.init_args.save_dir", str(grid.out),
        "--trainer.logger.init_args.name", run.name,
        "--trainer.logger.init_args.version", "",  # log straight into OUT/NAME
    ]
    return argv


def _ended(run_dir: Path) -> tuple[str | None, str]:
    """``(status, reason)`` of the run's ``summary.json`` (``completed``, ``interrupted``, ``aborted``); ``(None,
    "")`` without one."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return None, ""
    written = json.loads(summary.read_text(encoding="utf-8"))
    return str(written.get("status")), str(written.get("reason") or "no reason recorded")


class SweepStopped(Exception):
    """SIGINT or SIGTERM stopped the sweep; the run in progress ended first (its folder says how)."""

    def __init__(self, signum: int, results: list[tuple[GridRun, str]]) -> None:
        self.signum = signum
        self.results = results
        super().__init__(f"sweep stopped by {signal.Signals(signum).name}")


class _SignalForwarder:
    """Remembers the first SIGINT/SIGTERM and passes each one to the running child, if any."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, argv: list[str], log: Any) -> int:
        """Run ``argv`` to its end (its own session: a terminal's signals reach it only through us); its exit code."""
        self.child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if self.received is not None:  # arrived while it was being started
            self.child.send_signal(self.received)
        try:
            return self.child.wait()
        finally:
            self.child = None


@contextmanager
def _forwarding_signals() -> Iterator[_SignalForwarder]:
    """Install a :class:`_SignalForwarder` for SIGINT and SIGTERM (main thread only), restoring the handlers after."""
    forwarder = _SignalForwarder()
    if threading.current_thread() is not threading.main_thread():
        yield forwarder
        return
    previous = {signum: signal.signal(signum, forwarder) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield forwarder
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_grid(grid: Grid, dry_run: bool = False, echo=print,
             shard: tuple[int, int] = (0, 1)) -> list[tuple[GridRun, str]]:
    """Run every run of the grid that is not done yet, one after another.

    ``shard = (i, n)`` takes only the runs at positions ``i, i + n, i + 2n, ...`` (0-based), so
    ``n`` sweeps of one grid can run side by side without sharing a run.

    Returns ``(run, status)`` pairs, status one of ``done`` (skipped), ``ran``,
    ``failed (exit N)``, ``failed (earlier)`` or ``planned`` (dry run). A failed run is reported and the grid
    goes on; its directory keeps its ``train.log``. A signal ends the run in progress (see the module's docstring)
    and raises :class:`SweepStopped` with the results so far, that run ``interrupted``.
    """
    with _forwarding_signals() as forwarder:
        return _run_grid(grid, dry_run, echo, shard, forwarder)


def _run_grid(grid: Grid, dry_run: bool, echo, shard: tuple[int, int],
              forwarder: _SignalForwarder) -> list[tuple[GridRun, str]]:
    results: list[tuple[GridRun, str]] = []
    for index, run in enumerate(grid.runs, start=1):
        if forwarder.received is not None:  # between runs: the next one is not started
            raise SweepStopped(forwarder.received, results)
        if (index - 1) % shard[1] != shard[0]:
            continue
        run_dir = grid.out / run.name
        prefix = f"[{index}/{len(grid.runs)}] {run.name}"
        status, reason = _ended(run_dir)
        if status == "completed":
            echo(f"{prefix}: done, skipped")
            results.append((run, "done"))
            continue
        if status == "aborted":
            echo(f"{prefix}: FAILED earlier ({reason}), skipped; delete {run_dir} to run it again")
            results.append((run, "failed (earlier)"))
            continue
        argv = _argv(grid, run)
        if dry_run:
            echo(f"{prefix}: {shlex.join(['ggpo-train', *argv[3:]])}")  # pasteable: quoted, '' kept
            results.append((run, "planned"))
            continue
        if run_dir.exists():
            echo(f"{prefix}: {'interrupted' if status else 'unfinished'} earlier, starting over")
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        atomic_write_text(run_dir / RUN_LABELS, json.dumps(run.labels, indent=2) + "\n")
        echo(f"{prefix}: running")
        with open(run_dir / "train.log", "w", encoding="utf-8") as log:
            code = forwarder.run(argv, log)
        if forwarder.received is not None:
            signame = signal.Signals(forwarder.received).name
            if code == 0 and _ended(run_dir)[0] == "completed":  # the signal landed as the finished run exited
                echo(f"{prefix}: completed as {signame} arrived; a later sweep skips it")
                results.append((run, "ran"))
            else:
                echo(f"{prefix}: stopped by {signame} (exit code {code}); run the sweep again to start it over")
                results.append((run, "interrupted"))
            raise SweepStopped(forwarder.received, results)
        if code != 0:
            echo(f"{prefix}: FAILED with exit code {code}; see {run_dir / 'train.log'}")
        results.append((run, "ran" if code == 0 else f"failed (exit {code})"))
    return results
