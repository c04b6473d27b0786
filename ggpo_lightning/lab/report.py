"""Reports over finished runs: final held-out accuracy per objective x setting, and learning curves.

A run is a directory with ``metrics.csv`` (Lightning's CSV logger) and, once finished,
``summary.json``. Its labels come from ``grid_run.json`` (written by ``ggpo sweep``):
``objective``, ``setting`` and ``seed``; a run made by hand falls back to the summary's
objective and recipe. Final accuracy is the summary's ``accuracy_after``; a run
without ``summary.json`` is unfinished: read, but left out of tables and plots.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ggpo_lightning.records.atomic import atomic_write_bytes
from ggpo_lightning.records.extras import require
from ggpo_lightning.lab.sweep import RUN_LABELS

__all__ = ["FAMILY", "Lead", "RIVALS", "Run", "STEP_MEANS", "collect_runs", "family_lead_table", "family_ran", "gain_table", "lead_table", "leads", "markdown_table",
           "plot_curves", "plot_lead", "step_mean_table"]

# "ggpo" is the shipped GGPO (behavior anchor lambda = beta when stale), "ggpo-paper" the paper's (anchor off,
# recipes/baselines/ggpo-paper.yaml): side by side in every table and plot; GRPO's corrections for stale rollouts
# (recipes/baselines/grpo-*.yaml) are told apart from plain GRPO by their overlay's name
FAMILY = ("oapl", "m2po", "prime_rl", "vespo")
"""The objectives that, like GGPO, learn from lagged data on purpose (docs/METHOD.md#objectives-that-embrace-lagged-data):
GGPO's lead over each is reported on its own (:func:`family_lead_table`), not folded into the best of :data:`RIVALS`."""
OBJECTIVE_ORDER = ("ggpo", "ggpo-paper", "ggpo_anchor", "agro", "grpo", "grpo-tis", "grpo-seq-tis", "grpo-seq-mask",
                   "grpo-icepop", "grpo-opsm", "maxrl") + FAMILY
RIVALS = ("grpo", "grpo-tis", "grpo-seq-tis", "grpo-seq-mask", "grpo-icepop", "grpo-opsm")
"""GRPO and its corrections for stale rollouts: the objectives GGPO's lead is measured against (:func:`leads`)."""

STEP_MEANS = {
    "kl_behavior_k1": ("Drift: KL(mu || pi) on the behavior samples, per sequence (nats)", 3),
    "token_log_ratio_mean": ("Drift per token: the step's summed log pi/mu over its summed response length (nats)", 4),
    "coverage_log_ratio_p95": ("Coverage: 95th percentile of the sequences' log pi/mu, a lower bound on log C (nats)",
                               2),
    "coverage_log_ratio_max": ("Coverage: largest log pi/mu of a step, a lower bound on log C (nats)", 2),
    "coverage_ess_share": ("Effective sample size of pi/mu, share of the step's responses", 3),
    "response_length": ("Mean response length (tokens)", 1),
    "staleness": ("Staleness: optimizer steps since the weights that sampled a step's groups, their mean", 2),
}
"""Per-step metrics (``train/<name>``, docs/METHOD.md#diagnostics) whose mean over a run's steps the report tables:
the name -> (the table's title, decimals)."""


@dataclass
class Run:
    """One run's labels, final accuracy and curves (lists of ``(x, y)``)."""

    path: Path
    objective: str
    setting: str
    seed: int | None
    final_accuracy: float | None
    """``accuracy_after`` of ``summary.json``; None while the run is unfinished."""
    start_accuracy: float | None = None
    """``accuracy_before`` of ``summary.json``: the starting model's (each seed may warm up a model of its own)."""
    accuracy: list[tuple[int, float]] = field(default_factory=list)
    """``(optimizer step, val/accuracy)``."""
    accuracy_by_samples: list[tuple[float, float]] = field(default_factory=list)
    """``(generated samples so far, val/accuracy)``."""
    reward: list[tuple[int, float]] = field(default_factory=list)
    """``(optimizer step, train/reward)``."""
    drift: list[tuple[int, float]] = field(default_factory=list)
    """``(optimizer step, train/kl_behavior_k1)``: KL(mu || pi) on the step's behavior samples."""
    coverage: list[tuple[int, float]] = field(default_factory=list)
    """``(optimizer step, train/coverage_log_ratio_p95)``: a lower bound on log C."""
    step_means: dict[str, float] = field(default_factory=dict)
    """The mean over the run's steps of each :data:`STEP_MEANS` metric it logged."""


def _float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def _read_run(path: Path) -> Run:
    metrics = path / "metrics.csv"
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    labels = json.loads((path / RUN_LABELS).read_text()) if (path / RUN_LABELS).is_file() else {}
    if not metrics.is_file():
        if labels and not summary:  # a sweep's run that has not logged yet (e.g. generating its offline data)
            return Run(path, str(labels.get("objective")), str(labels.get("setting")), labels.get("seed"), None)
        raise FileNotFoundError(f"{path}: no metrics.csv (not a ggpo-train run directory, or it never logged)")
    with open(metrics, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    accuracy, reward, by_samples = [], [], []
    logged: dict[str, list[tuple[int, float]]] = {name: [] for name in STEP_MEANS}
    samples = 0.0
    for row in rows:
        step = int(row["step"])
        samples = _float(row.get("train/generated_samples")) or samples
        if (r := _float(row.get("train/reward"))) is not None:
            reward.append((step, r))
        for name, points in logged.items():
            if (v := _float(row.get(f"train/{name}"))) is not None and math.isfinite(v):
                points.append((step, v))
        if (a := _float(row.get("val/accuracy"))) is not None:
            accuracy.append((step + 1, a))  # logged after the update of `step`: step + 1 updates done
            by_samples.append((samples, a))
    if summary.get("accuracy_before") is not None:
        accuracy.insert(0, (0, summary["accuracy_before"]))
        by_samples.insert(0, (0.0, summary["accuracy_before"]))
    final = summary.get("accuracy_after")
    steps = summary.get("optimizer_steps")
    if final is not None and steps is not None and (not accuracy or accuracy[-1][0] < steps):
        accuracy.append((steps, final))  # measured at the end of fit, not logged to metrics.csv
        by_samples.append((float(summary.get("generated_samples") or samples), final))
    return Run(
        path=path,
        objective=str(labels.get("objective") or _objective_of(summary)),
        setting=str(labels.get("setting") or summary.get("recipe") or path.name),
        seed=labels.get("seed"),
        final_accuracy=final,
        start_accuracy=summary.get("accuracy_before"),
        accuracy=accuracy,
        accuracy_by_samples=by_samples,
        reward=reward,
        drift=logged["kl_behavior_k1"],
        coverage=logged["coverage_log_ratio_p95"],
        step_means={name: statistics.fmean(v for _, v in points) for name, points in logged.items() if points},
    )


def _objective_of(summary: dict) -> str:
    """A run made by hand: the baseline overlay its recipe names last (``quickstart+ggpo-paper`` -> ``ggpo-paper``),
    else the summary's objective (the paper's GGPO and the shipped one share the objective name ``ggpo``)."""
    overlay = str(summary.get("recipe") or "").rpartition("+")[2]
    return overlay if overlay in OBJECTIVE_ORDER else str(summary.get("objective") or "?")


def collect_runs(paths: list[str | os.PathLike]) -> tuple[list[Run], list[str]]:
    """Runs under ``paths`` (run directories, or folders searched for them) and one error
    line per directory that could not be read; one bad run never hides the others."""
    runs, errors = [], []
    for root in map(Path, paths):
        if not root.exists():
            errors.append(f"{root}: does not exist")
            continue
        candidates = {p.parent for p in root.rglob("metrics.csv")} | {p.parent for p in root.rglob(RUN_LABELS)}
        if (root / "metrics.csv").exists() or (root / RUN_LABELS).exists() or not candidates:
            candidates.add(root)
        for path in sorted(candidates):
            try:
                runs.append(_read_run(path))
            except (OSError, ValueError, KeyError) as exc:
                errors.append(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
    return runs, errors


def _ordered(values: set[str], preferred: tuple[str, ...] = ()) -> list[str]:
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * mean:.1f} ± {100 * std:.1f} (n={len(values)})"


def _table(runs: list[Run], settings_order: list[str] | None, value, cell) -> str:
    objectives = _ordered({r.objective for r in runs}, OBJECTIVE_ORDER)
    settings = settings_order or _ordered({r.setting for r in runs})
    lines = ["| objective | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for objective in objectives:
        cells = [cell([v for r in runs if r.objective == objective and r.setting == s
                       and (v := value(r)) is not None]) for s in settings]
        lines.append(f"| {objective} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_table(runs: list[Run], settings_order: list[str] | None = None) -> str:
    """Final held-out accuracy in percent, mean ± sample std over seeds; objectives x settings."""
    return _table(runs, settings_order, lambda r: r.final_accuracy, _mean_std)


def gain_table(runs: list[Run], settings_order: list[str] | None = None) -> str:
    """Final minus starting held-out accuracy in points, mean ± sample std over seeds: the comparison when seeds
    start from models of their own; objectives x settings ("–" where no run recorded its start)."""
    def gain(run: Run) -> float | None:
        if run.final_accuracy is None or run.start_accuracy is None:
            return None
        return run.final_accuracy - run.start_accuracy

    return _table(runs, settings_order, gain, _mean_std)


def step_mean_table(runs: list[Run], metric: str, settings_order: list[str] | None = None) -> str:
    """A :data:`STEP_MEANS` metric averaged over each run's steps, mean ± sample std over seeds; objectives x
    settings ("–" where no run logged it)."""
    digits = STEP_MEANS[metric][1]

    def cell(values: list[float]) -> str:
        if not values:
            return "–"
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.{digits}f} ± {std:.{digits}f}"

    return _table(runs, settings_order, lambda r: r.step_means.get(metric), cell)


@dataclass
class Lead:
    """A leader's lead over the best rival in one setting: ``differences`` are leader minus rival final held-out
    accuracy, one per seed both ran (seeds share a starting model, so the difference is paired)."""

    setting: str
    staleness: float | None
    """The mean over the setting's runs of their mean ``train/staleness`` (None where none logged it)."""
    rival: str
    """The rival (of the ones :func:`leads` was given, :data:`RIVALS` by default) with the highest mean final accuracy in this setting, ranked among the rivals
    run on the most of the leader's seeds, over the seeds they share (each one's own where they share none): a
    rival run on fewer seeds (a trimmed cell) is neither ranked above one run on all of them on its favourable
    seed, nor shrinks the others' ranking to its seeds. Ties go to the first in the rivals' order."""
    rival_accuracy: float
    """The rival's mean final accuracy over the seeds both ran (the leader's likewise)."""
    leader_accuracy: float
    differences: list[float]


def leads(runs: list[Run], leader: str = "ggpo", settings_order: list[str] | None = None,
          rivals: tuple[str, ...] = RIVALS) -> list[Lead]:
    """``leader``'s lead over the best of ``rivals`` in each setting where both ran a seed, in ``settings_order``
    (one rival: the lead over that objective)."""
    def accuracy(objective: str, setting: str) -> dict[int | None, float]:
        return {r.seed: r.final_accuracy for r in runs
                if r.objective == objective and r.setting == setting and r.final_accuracy is not None}

    found = []
    for setting in settings_order or _ordered({r.setting for r in runs}):
        ours = accuracy(leader, setting)
        ran = {rival: by_seed for rival in rivals if (by_seed := accuracy(rival, setting))}
        if not ours or not ran:
            continue
        with_ours = {rival: ours.keys() & by_seed.keys() for rival, by_seed in ran.items()}
        most = max(len(seeds) for seeds in with_ours.values())
        if not most:
            continue
        ranked = [rival for rival in ran if len(with_ours[rival]) == most]  # a trimmed rival is not ranked
        shared = set.intersection(*(with_ours[rival] for rival in ranked))
        best = max(ranked, key=lambda rival: statistics.fmean(
            ran[rival][seed] for seed in shared or with_ours[rival]))
        paired = sorted(ours.keys() & ran[best].keys(), key=str)
        staleness = [r.step_means["staleness"] for r in runs if r.setting == setting and "staleness" in r.step_means]
        found.append(Lead(setting, statistics.fmean(staleness) if staleness else None, best,
                          statistics.fmean(ran[best][seed] for seed in paired),
                          statistics.fmean(ours[seed] for seed in paired),
                          [ours[seed] - ran[best][seed] for seed in paired]))
    return found


def lead_table(runs: list[Run], leaders: tuple[str, ...] = ("ggpo", "ggpo-paper"),
               settings_order: list[str] | None = None) -> str:
    """Per leader and setting: the best rival and its accuracy, the leader's, and the paired lead in points (mean ±
    sample std over the seeds both ran)."""
    lines = ["| objective | setting | mean staleness | best of GRPO and its corrections | its accuracy (%) "
             "| accuracy (%) | lead (points) |", "|---" * 7 + "|"]
    lines += [_lead_row(leader, lead) for leader in leaders for lead in leads(runs, leader, settings_order)]
    return "\n".join(lines) + "\n"


def family_ran(runs: list[Run]) -> list[str]:
    """The objectives of :data:`FAMILY` that ran, each followed by its variants that ran (a grid label
    ``<objective>-<variant>``, e.g. ``oapl-beta0.04``: the same objective at other settings), in :data:`FAMILY`'s
    order."""
    ran = sorted({r.objective for r in runs if r.objective})
    return [label for name in FAMILY for label in ran if label == name or label.startswith(f"{name}-")]


def family_lead_table(runs: list[Run], leader: str = "ggpo", settings_order: list[str] | None = None) -> str:
    """``leader``'s paired lead over each objective of :data:`FAMILY` and each variant of one that ran
    (:func:`family_ran`), per setting (empty rows when none did)."""
    lines = ["| objective | setting | mean staleness | rival | its accuracy (%) | accuracy (%) | lead (points) |",
             "|---" * 7 + "|"]
    lines += [_lead_row(leader, lead) for rival in family_ran(runs)
              for lead in leads(runs, leader, settings_order, (rival,))]
    return "\n".join(lines) + "\n"


def _lead_row(leader: str, lead: Lead) -> str:
    staleness = "–" if lead.staleness is None else f"{lead.staleness:.2f}"
    return (f"| {leader} | {lead.setting} | {staleness} | {lead.rival} | {100 * lead.rival_accuracy:.1f} "
            f"| {100 * lead.leader_accuracy:.1f} | {_mean_std(lead.differences)} |")


def _mean_curve(curves: list[list[tuple[float, float]]]) -> tuple[list[float], list[float], list[float]]:
    """Mean and sample std over seeds at the x values all curves share (runs of one cell log at the same
    steps); std 0 for a single curve."""
    shared = set.intersection(*(set(x for x, _ in c) for c in curves)) if curves else set()
    xs = sorted(shared)
    values = [[dict(c)[x] for c in curves] for x in xs]
    return xs, [statistics.fmean(v) for v in values], [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]


def _smooth(points: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    out = []
    for i in range(len(points)):
        chunk = points[max(0, i - window + 1):i + 1]
        out.append((points[i][0], statistics.fmean(y for _, y in chunk)))
    return out


def plot_curves(runs: list[Run], directory: str | os.PathLike, settings_order: list[str] | None = None,
                reward_window: int = 25) -> list[Path]:
    """Five PNGs, one panel per setting and one line per objective (mean over seeds, a band of ± one std):
    held-out accuracy vs optimizer steps, vs generated samples, training reward, the drift KL(mu || pi) and the
    coverage bound (95th percentile of log pi/mu) vs steps (the last three moving averages over ``reward_window``
    steps).
    Written atomically."""
    require("matplotlib", "plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    objectives = _ordered({r.objective for r in runs}, OBJECTIVE_ORDER)
    settings = settings_order or _ordered({r.setting for r in runs})
    figures = {
        "accuracy_vs_steps.png": ("accuracy", "optimizer steps", "held-out accuracy"),
        "accuracy_vs_samples.png": ("accuracy_by_samples", "generated samples", "held-out accuracy"),
        "reward_vs_steps.png": ("reward", "optimizer steps", f"train reward ({reward_window}-step mean)"),
        "drift_vs_steps.png": ("drift", "optimizer steps", f"KL(mu || pi), nats ({reward_window}-step mean)"),
        "coverage_vs_steps.png": ("coverage", "optimizer steps",
                                  f"p95 of log pi/mu, nats ({reward_window}-step mean)"),
    }
    smoothed = ("reward", "drift", "coverage")
    # one colour per objective in every panel (the default cycle restarts per panel and repeats after 10)
    palette = plt.get_cmap("tab10" if len(objectives) <= 10 else "tab20")
    colors = {objective: palette(i) for i, objective in enumerate(objectives)}
    written = []
    cols = min(len(settings), 3)
    rows = math.ceil(len(settings) / cols)
    for filename, (attr, xlabel, ylabel) in figures.items():
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False,
                                 sharey=attr not in ("drift", "coverage"))
        for ax, setting in zip(axes.flat, settings):
            for objective in objectives:
                curves = [getattr(r, attr) for r in runs if r.setting == setting and r.objective == objective]
                curves = [(_smooth(c, reward_window) if attr in smoothed else c) for c in curves if c]
                if curves:
                    xs, ys, spread = _mean_curve(curves)
                    ax.plot(xs, ys, color=colors[objective], label=f"{objective} (n={len(curves)})")
                    ax.fill_between(xs, [y - s for y, s in zip(ys, spread)], [y + s for y, s in zip(ys, spread)],
                                    color=colors[objective], alpha=0.15, linewidth=0)
            ax.set(title=setting, xlabel=xlabel, ylabel=ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(settings):]:
            ax.set_visible(False)
        written.append(_save(fig, directory / filename))
    return written


def _save(fig, target: Path) -> Path:
    """``fig`` as a PNG at ``target``, written atomically; the figure closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")  # "tight": a legend beside the axes is kept
    plt.close(fig)
    atomic_write_bytes(target, png.getvalue())
    return target


def plot_lead(runs: list[Run], directory: str | os.PathLike, settings: list[str],
              leaders: tuple[str, ...] = ("ggpo", "ggpo-paper")) -> Path:
    """``lead_vs_staleness.png``: each leader's lead over the best of GRPO and its corrections, and GGPO's over each
    objective of :data:`FAMILY` and each variant of one that ran (:func:`family_ran`) (points of final held-out
    accuracy, mean over seeds, a band of ± one sample std of the paired differences), against the settings' measured
    mean staleness (a symmetric-log axis: on-policy is 0); the lead's axis is linear within ±10 points and logarithmic
    beyond, so a collapsed rival's lead (+50 points and more) does not flatten the others' onto zero. Each point of a
    lead over the best correction is labelled with its setting and that rival. ``settings`` are the ones to plot
    (e.g. the sync_every sweep), in order."""
    require("matplotlib", "plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.4, 4.0))
    lines = [(leader, "best correction", leads(runs, leader, settings)) for leader in leaders]
    family = family_ran(runs)
    lines += [("ggpo", rival, leads(runs, "ggpo", settings, (rival,))) for rival in family]
    for leader, against, found in lines:
        points = [lead for lead in found if lead.staleness is not None and lead.differences]
        if not points:
            continue
        xs = [lead.staleness for lead in points]
        means = [100 * statistics.fmean(lead.differences) for lead in points]
        spread = [100 * statistics.stdev(lead.differences) if len(lead.differences) > 1 else 0.0 for lead in points]
        counts = sorted({len(p.differences) for p in points})  # seeds per point: the label gives their range
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        of_family = against in family
        line, = ax.plot(xs, means, marker="s" if of_family else "o", linestyle="--" if of_family else "-",
                        label=f"{leader} vs {against} (n={seeds} seeds per point)")
        ax.fill_between(xs, [m - s for m, s in zip(means, spread)], [m + s for m, s in zip(means, spread)],
                        color=line.get_color(), alpha=0.12, linewidth=0)
        for lead, x, y in zip(points, xs, means):
            if not of_family:  # the family's rival is in its label; the best correction changes with the setting
                ax.annotate(f"{lead.setting} vs {lead.rival}", (x, y), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0.0)  # staleness is never negative; without a bound the symlog axis mirrors itself
    ax.set_yscale("symlog", linthresh=10.0)
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([-100, -50, -20, -10, -5, 0, 5, 10, 20, 50, 100]))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:+g}" if y else "0"))
    ax.set(xlabel="measured mean staleness (optimizer steps)", ylabel="lead (points of held-out accuracy)",
           title="GGPO minus the best correction, and minus each lagged-data objective")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: the lines stay visible
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _save(fig, directory / "lead_vs_staleness.png")
