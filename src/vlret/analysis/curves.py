"""Figures of a loss comparison, drawn from the runs' ``metrics.jsonl`` logs.

* :func:`plot_training_curves`: training loss with the dev loss beside it (``dev_loss``, the
  training loss on the dev split, dashed; Unified Fig. 3a) and the dev metric the runs select
  ``best.pt`` on (``train.select_on``: rsum, or T->I R@1 on person search as AdaCL Fig. 7
  plots it; :func:`selection_key`) against epochs, one line per loss (Unified paper Fig. 3);
  the mean over seeds with a min-max band. A loss that changes definition during the run (the
  all-negatives warm-up of ``train.all_negatives_epochs``) is drawn as one segment per
  definition, each relative to its own first epoch, and the switch is marked
  (:func:`loss_definition_starts`, :func:`relative_loss_segments`).

Epochs are numbered from 0 on every axis and table, as the console and ``metrics.jsonl``
number them. One legend per figure, outside the axes (:func:`._plotting.legend_outside`): a
colour (and marker) per label, and the line styles' meanings once.
* :func:`plot_similarity_curves`: mean positive and mean hardest-negative cosine on dev against
  epochs (Unified Fig. 4); runs logged without dev similarities fall back to the training
  batches' ``pos_sim`` / ``hardest_neg_sim`` step records, and the panel title says so.
* :func:`plot_sweep_curves`: test rsum against each swept parameter, one line per setting of
  the other parameters (Unified Fig. 5).
* :func:`plot_adacl_trajectories`: AdaCL m1 / m2 against steps (AdaCL Fig. 3a), through
  :func:`vlret.analysis.adacl_plots.plot_adacl_margins`.
* :func:`plot_goal_heatmap`: the 15 GOAL combinations (GOAL Tables 3-5): I->T R@1, T->I R@1
  and rsum as three heatmaps, rows triplet weight, columns pair weight.

The dev R@1 curves per direction (AdaCL Fig. 7) and the figure of ``vlret plot curves`` are in
:mod:`vlret.analysis.epoch_curves`.

matplotlib (the ``plot`` extra) is imported inside each function and drawn on an Agg canvas
without touching pyplot's global state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._files import atomic_write_text
from ..metrics import normalise_metric_record
from ._plotting import integer_epochs, legend_outside, new_figure, save_figure, series_styles

#: File names written by the functions of this module.
TRAINING_FIGURE = "curves_loss_rsum.png"
SIMILARITY_FIGURE = "curves_similarity.png"


def read_metrics_log(path: str | Path) -> list[dict[str, Any]]:
    """Read a trainer's ``metrics.jsonl``.

    Args:
        path: The log, or the run folder holding it.

    Returns:
        Its JSON object records in order, metric keys in today's spelling (an older log's
        ``dev_t2i_R1`` as ``dev_identity_t2i_r1``,
        :func:`vlret.metrics.normalise_metric_record`); a line that is not one (cut by a
        kill) is skipped.

    Raises:
        FileNotFoundError: No log at ``path``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"training log not found: {path}")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            records.append(normalise_metric_record(rec))
    return records


def epoch_series(records: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    """One key of the epoch records.

    Args:
        records: A run's records (:func:`read_metrics_log`).
        key: The metric, e.g. ``"dev_rsum"``.

    Returns:
        ``{epoch: value}`` (epochs from 0, as ``metrics.jsonl`` counts them) over the
        ``kind = "epoch"`` records with a numeric value.
    """
    out = {}
    for rec in records:
        value = rec.get(key)
        if rec.get("kind") == "epoch" and isinstance(value, (int, float)):
            out[int(rec["epoch"])] = float(value)
    return out


def selection_key(records: Sequence[Mapping[str, Any]]) -> str:
    """The epoch-record key of the dev metric a run selected ``best.pt`` on:
    ``dev_<select_on>`` as its epoch records name it (``dev_identity_t2i_r1`` on person
    search), or ``dev_rsum`` for a log written before ``train.select_on`` existed (those runs
    selected on rsum)."""
    for rec in records:
        name = rec.get("select_on")
        if rec.get("kind") == "epoch" and isinstance(name, str) and name:
            return f"dev_{name}"
    return "dev_rsum"


def step_epoch_means(records: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    """One key of the step records, averaged per epoch.

    Args:
        records: A run's records (:func:`read_metrics_log`).
        key: The step metric, e.g. ``"pos_sim"``.

    Returns:
        ``{epoch (from 0): mean of key}`` over the ``kind = "step"`` records with a finite
        value.
    """
    sums: dict[int, list[float]] = {}
    for rec in records:
        value = rec.get(key)
        if rec.get("kind") == "step" and isinstance(value, (int, float)) and math.isfinite(value):
            sums.setdefault(int(rec["epoch"]), []).append(float(value))
    return {e: sum(v) / len(v) for e, v in sums.items()}


def _aggregate(
    series: Sequence[Mapping[int, float]],
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Epochs present in any seed, with the mean, min and max over the seeds that have them."""
    epochs = sorted({e for s in series for e in s})
    mean, low, high = [], [], []
    for e in epochs:
        vals = [s[e] for s in series if e in s]
        mean.append(sum(vals) / len(vals))
        low.append(min(vals))
        high.append(max(vals))
    return epochs, mean, low, high


def _draw(
    ax,
    series: Sequence[Mapping[int, float]],
    *,
    label: str | None,
    color,
    style="-",
    marker: str = "o",
) -> bool:
    series = [s for s in series if s]
    if not series:
        return False
    epochs, mean, low, high = _aggregate(series)
    shown = marker if len(epochs) < 30 else None
    ax.plot(epochs, mean, style, color=color, label=label, marker=shown)
    if len(series) > 1 and len(epochs) > 1:
        ax.fill_between(epochs, low, high, color=color, alpha=0.15, linewidth=0)
    return True


def _key(color: Any, marker: str | None, style: Any = "-") -> Any:
    """A legend handle: a line of ``style`` with ``marker`` (a colour's or a style's key)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, marker=marker, linestyle=style)


def _epoch_axes(axes: Sequence[Any]) -> None:
    for ax in axes:
        ax.set_xlabel("epoch (from 0)")
        integer_epochs(ax)
        ax.grid(alpha=0.3)


#: File written by :func:`write_epoch_curves` (no matplotlib needed).
CURVES_TABLE = "curves.md"
#: The epoch-record keys tabulated in ``curves.md``, with their titles.
CURVE_KEYS: tuple[tuple[str, str], ...] = (
    ("dev_rsum", "Dev rsum"),
    ("dev_loss", "Dev loss (the training loss on the dev split)"),
    ("dev_i2t_r1", "Dev I->T R@1"),
    ("dev_t2i_r1", "Dev T->I R@1"),
    ("dev_pos_sim", "Dev mean positive cosine"),
    ("dev_hardest_neg_sim", "Dev mean hardest-negative cosine"),
)


def epoch_curve_markdown(
    runs: Mapping[str, Sequence[str | Path]], key: str, *, title: str = "", digits: int = 1
) -> str:
    """One key of the epoch records against epochs, as a markdown table.

    Args:
        runs: Label -> the run folders of its seeds.
        key: The epoch metric (:func:`epoch_series`).
        title: A ``###`` heading above the table; none when empty.
        digits: Decimals of each cell.

    Returns:
        One row per label and one column per epoch (from 0, ``ep 0`` the first): the mean
        over the seeds that logged the epoch, with ``± sample std`` when there are two or
        more; ``-`` where none did.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
    """
    series = {
        label: [epoch_series(read_metrics_log(Path(d) / "metrics.jsonl"), key) for d in dirs]
        for label, dirs in runs.items()
    }
    epochs = sorted({e for ss in series.values() for s in ss for e in s})
    lines = [f"### {title}", ""] if title else []
    lines.append("| Loss | " + " | ".join(f"ep {e}" for e in epochs) + " |")
    lines.append("|:---|" + "---:|" * len(epochs))
    for label, ss in series.items():
        cells = []
        for e in epochs:
            vals = [s[e] for s in ss if e in s]
            if not vals:
                cells.append("-")
                continue
            mean = math.fsum(vals) / len(vals)
            if len(vals) < 2:
                cells.append(f"{mean:.{digits}f}")
                continue
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
            cells.append(f"{mean:.{digits}f} ± {std:.{digits}f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_epoch_curves(runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path) -> Path:
    """Write ``curves.md`` atomically: :func:`epoch_curve_markdown` of the metric the runs
    selected on (:func:`selection_key`, e.g. ``dev_identity_t2i_r1`` on person search) first,
    then of each :data:`CURVE_KEYS` key that some run logged (metrics with one decimal, cosines
    and the dev loss with three).

    Args:
        runs: Label -> the run folders of its seeds.
        out_dir: The folder of ``curves.md`` (created if missing).

    Returns:
        The path written.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
    """
    logs = [read_metrics_log(Path(d) / "metrics.jsonl") for dirs in runs.values() for d in dirs]
    keys = dict.fromkeys(selection_key(r) for r in logs)
    titled = [(k, f"Dev {k[len('dev_') :]} (selects best.pt)") for k in keys]
    titled += [(k, title) for k, title in CURVE_KEYS if k not in keys]
    parts = [
        epoch_curve_markdown(runs, key, title=title, digits=_digits(key))
        for key, title in titled
        if any(epoch_series(r, key) for r in logs)
    ]
    path = Path(out_dir) / CURVES_TABLE
    atomic_write_text(path, "\n".join(parts))
    return path


def _digits(key: str) -> int:
    """Decimals of a ``curves.md`` cell: three for cosines and losses, one for metrics."""
    return 3 if key.endswith("_sim") or key.endswith("_loss") else 1


def loss_definition_starts(run_dir: str | Path) -> tuple[int, ...]:
    """The epochs at which a run's training loss takes a new definition.

    Args:
        run_dir: The run folder (its ``config.yaml`` is read; a missing or unreadable one
            counts as no warm-up).

    Returns:
        The start epochs (from 0): ``(0,)``, or ``(0, n)`` for a run with
        ``train.all_negatives_epochs = n`` (the hinge summed over all negatives, then the
        hardest; :mod:`vlret.run.warmup`).
    """
    from .._extras import require

    yaml = require("yaml", "reading a run's config.yaml")

    path = Path(run_dir) / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except yaml.YAMLError:
        config = None
    train = config.get("train") if isinstance(config, dict) else None
    warmup = train.get("all_negatives_epochs") if isinstance(train, dict) else None
    if isinstance(warmup, int) and not isinstance(warmup, bool) and warmup > 0:
        return (0, warmup)
    return (0,)


def relative_loss_segments(
    series: Mapping[int, float],
    starts: Sequence[int] = (0,),
    *,
    reference: Mapping[int, float] | None = None,
) -> list[dict[int, float]]:
    """Cut a loss series at each definition start and scale each part by its first value, so
    that losses of different scales share an axis and a warm-up loss does not make the loss
    after it look like zero.

    Args:
        series: Epoch -> training loss.
        starts: The epochs (from 0) at which a definition starts
            (:func:`loss_definition_starts`).
        reference: The series whose first value in each part is the divisor (the dev loss is
            scaled by the training loss's, so the two stay comparable); default ``series``.

    Returns:
        One dict per start: the part's values divided by the absolute value of the reference's
        first; empty where the run has no epoch of that definition, or that first value is 0
        or not finite.
    """
    bounds = sorted(set(starts))
    ref = series if reference is None else reference
    out = []
    for i, start in enumerate(bounds):
        stop = bounds[i + 1] if i + 1 < len(bounds) else math.inf
        part = {e: v for e, v in sorted(series.items()) if start <= e < stop}
        scale = {e: v for e, v in sorted(ref.items()) if start <= e < stop}
        first = scale[min(scale)] if scale else 0.0
        ok = first != 0 and math.isfinite(first)
        out.append({e: v / abs(first) for e, v in part.items()} if ok else {})
    return out


def plot_training_curves(runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path) -> Path:
    """Draw training loss, the dev loss, and the dev selection metric against epochs (Unified
    loss paper Fig. 3a-b; AdaCL Fig. 7 plots R@1 against epochs on person search): each
    label's runs' :func:`selection_key`, ``dev_rsum`` unless ``train.select_on`` named another
    metric.

    Each loss definition is drawn relative to its first epoch's training loss
    (:func:`relative_loss_segments`); the dev loss (``dev_loss``, dashed, same colour; runs
    that logged one) by the same divisor, so the gap between the two is the generalisation
    gap; the mean over seeds with a min-max band. A run whose loss changes definition
    (``train.all_negatives_epochs``) gets one segment per definition, and a dotted line marks
    the switch on both panels.

    Args:
        runs: Label -> the run folders of its seeds; one colour per label on both panels.
        out_dir: The folder of the figure.

    Returns:
        The path of ``curves_loss_rsum.png``.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
        ImportError: matplotlib is not installed.
    """
    logs = {label: [read_metrics_log(d) for d in dirs] for label, dirs in runs.items()}
    starts = {label: [loss_definition_starts(d) for d in dirs] for label, dirs in runs.items()}
    fig = new_figure((12.0, 5.0), layout="constrained")
    ax_loss, ax_rsum = fig.subplots(1, 2)
    switches: dict[int, list[str]] = {}
    selected: set[str] = set()
    handles, names, any_dev = [], [], False
    for (color, marker), (label, recs) in zip(series_styles(len(logs)), logs.items(), strict=True):
        phases = max((len(s) for s in starts[label]), default=1)
        segments: list[list[dict[int, float]]] = [[] for _ in range(phases)]
        dev_segments: list[list[dict[int, float]]] = [[] for _ in range(phases)]
        for r, run_starts in zip(recs, starts[label], strict=True):
            train = epoch_series(r, "train_loss")
            for i, segment in enumerate(relative_loss_segments(train, run_starts)):
                segments[i].append(segment)
            dev = epoch_series(r, "dev_loss")
            for i, segment in enumerate(relative_loss_segments(dev, run_starts, reference=train)):
                dev_segments[i].append(segment)
            for start in run_starts[1:]:
                if label not in switches.setdefault(start, []):
                    switches[start].append(label)
        drawn = dev_drawn = False
        look = {"color": color, "marker": marker}
        for phase in segments:
            drawn |= _draw(ax_loss, phase, label=label if not drawn else None, **look)
        for phase in dev_segments:
            dev_label = f"{label} (dev)" if not dev_drawn else None
            dev_drawn |= _draw(ax_loss, phase, label=dev_label, style="--", **look)
        any_dev |= dev_drawn
        key = selection_key(recs[0]) if recs else "dev_rsum"
        selected.add(key[len("dev_") :])
        _draw(ax_rsum, [epoch_series(r, key) for r in recs], label=label, **look)
        handles.append(_key(color, marker))
        names.append(label)
    handles += [_key("0.2", None), _key("0.2", None, "--")] if any_dev else []
    names += ["training loss (solid)", "dev loss (dashed)"] if any_dev else []
    for start, labels in sorted(switches.items()):
        text = f"all-negatives warm-up ends ({', '.join(labels)})"
        for ax in (ax_loss, ax_rsum):
            ax.axvline(start - 0.5, color="0.4", linestyle=":", linewidth=1.2, label=text)
        handles.append(_key("0.4", None, ":"))
        names.append(text)
    ax_loss.set_title("training loss, dev loss dashed (÷ |first training epoch|)", fontsize=10)
    ax_loss.set_ylabel("relative loss")
    name = selected.pop() if len(selected) == 1 else "selection metric"
    ax_rsum.set_title(f"dev {name}")
    ax_rsum.set_ylabel(name)
    _epoch_axes((ax_loss, ax_rsum))
    if handles:
        legend_outside(fig, handles, names)
    fig.suptitle(f"Loss and dev {name} against epochs (cf. Unified loss Fig. 3)")
    return save_figure(fig, Path(out_dir) / TRAINING_FIGURE)


def plot_similarity_curves(runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path) -> Path:
    """Draw mean positive (solid) and mean hardest-negative (dashed) cosine against epochs, one
    panel per label (Unified loss paper Fig. 4).

    A label whose runs logged no dev similarities is drawn from the training batches'
    ``pos_sim`` / ``hardest_neg_sim`` step records, and its panel title says so.

    Args:
        runs: Label -> the run folders of its seeds; one panel per label, up to three panels
            a row.
        out_dir: The folder of the figure.

    Returns:
        The path of ``curves_similarity.png``.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
        ImportError: matplotlib is not installed.
    """
    logs = {label: [read_metrics_log(d) for d in dirs] for label, dirs in runs.items()}
    n = max(len(logs), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = new_figure((4.6 * cols, 3.6 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax, (label, recs) in zip(axes, logs.items(), strict=False):
        pos = [epoch_series(r, "dev_pos_sim") for r in recs]
        neg = [epoch_series(r, "dev_hardest_neg_sim") for r in recs]
        where = "dev"
        if not any(pos):
            pos = [step_epoch_means(r, "pos_sim") for r in recs]
            neg = [step_epoch_means(r, "hardest_neg_sim") for r in recs]
            where = "train batches"
        _draw(ax, pos, label="positive", color="tab:blue")
        _draw(ax, neg, label="hardest negative", color="tab:red", style="--")
        ax.set_title(f"{label} ({where})", fontsize=10)
        ax.set_ylabel("cosine similarity")
    _epoch_axes(axes[: len(logs)])
    for ax in axes[len(logs) :]:
        ax.set_visible(False)
    handles = [_key("tab:blue", "o"), _key("tab:red", "o", "--")]
    legend_outside(fig, handles, ["mean positive", "mean hardest negative"])
    fig.suptitle("Positive and hardest-negative similarity against epochs (cf. Unified Fig. 4)")
    return save_figure(fig, Path(out_dir) / SIMILARITY_FIGURE)


def _value_key(v: Any) -> tuple:
    return (0, float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, str(v))


def plot_sweep_curves(
    points: Sequence[tuple[Mapping[str, Any], float, float]],
    params: Sequence[str],
    out_dir: str | Path,
    *,
    loss: str = "",
    metric: str = "rsum",
) -> list[Path]:
    """Draw a metric against each swept parameter (Unified loss paper Fig. 5).

    Args:
        points: ``(parameter values, mean, std)`` of each grid point.
        params: The swept parameters, keys of every point's values.
        out_dir: The folder of the figures.
        loss: The loss name, put in the titles when not empty.
        metric: The metric's name on the axis and in the titles.

    Returns:
        One figure ``sweep_{param}.png`` per parameter: the mean with a std error bar against
        the parameter, one line per setting of the other swept parameters.

    Raises:
        ImportError: matplotlib is not installed.
    """
    paths = []
    for param in params:
        others = [p for p in params if p != param]
        lines: dict[tuple, list[tuple[Any, float, float]]] = {}
        for values, mean, std in points:
            key = tuple((p, values[p]) for p in others)
            lines.setdefault(key, []).append((values[param], mean, std))
        fig = new_figure((6.4, 4.8), layout="constrained")
        ax = fig.subplots()
        numeric = all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for values, _, _ in points
            for v in [values[param]]
        )
        styles = series_styles(len(lines))
        for (color, marker), (key, pts) in zip(styles, lines.items(), strict=True):
            pts = sorted(pts, key=lambda t: _value_key(t[0]))
            xs = [p[0] if numeric else str(p[0]) for p in pts]
            label = ", ".join(f"{k}={v}" for k, v in key) or None
            ax.errorbar(
                xs,
                [p[1] for p in pts],
                yerr=[p[2] for p in pts],
                marker=marker,
                capsize=3,
                color=color,
                label=label,
            )
        ax.set_xlabel(param)
        ax.set_ylabel(f"test {metric}")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            legend_outside(fig, handles, labels)
        name = f"{loss}: " if loss else ""
        ax.set_title(f"{name}{metric} against {param} (cf. Unified Fig. 5)")
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in param)
        paths.append(save_figure(fig, Path(out_dir) / f"sweep_{safe}.png"))
    return paths


def adacl_stats_from_log(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """AdaCL's margin records from a trainer log.

    Args:
        records: A run's records (:func:`read_metrics_log`); the step records carry the
            loss's ``last_stats`` under keys with a ``loss_`` prefix.

    Returns:
        The stats records of :mod:`vlret.analysis.adacl_plots` (prefix removed), one per step
        record that logged ``m1`` and ``m2``, with the trainer step as ``step``.
    """
    out = []
    for rec in records:
        if rec.get("kind") != "step" or rec.get("loss_m1") is None or rec.get("loss_m2") is None:
            continue
        stats = {
            k[len("loss_") :]: v for k, v in rec.items() if k.startswith("loss_") and k != "loss"
        }
        stats["step"] = rec["step"]
        out.append(stats)
    return out


def plot_adacl_trajectories(
    runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path
) -> list[Path]:
    """Draw AdaCL's margins m1, m2 against steps (AdaCL paper Fig. 3a) for each label.

    Args:
        runs: Label -> the run folders of its seeds; the first seed with logged margins is
            drawn, a label without any is skipped.
        out_dir: The folder of the figures.

    Returns:
        The figures ``adacl_margins_{label}.png``; the stats drawn are kept next to each as
        ``adacl_margins_{label}.jsonl``.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
        ImportError: matplotlib is not installed.
    """
    from .adacl_plots import append_stats, plot_adacl_margins

    out_dir = Path(out_dir)
    paths = []
    for label, dirs in runs.items():
        for run_dir in dirs:
            stats = adacl_stats_from_log(read_metrics_log(run_dir))
            if not stats:
                continue
            work = out_dir / f"adacl_{label}"
            stats_file = work / "stats.jsonl"
            if stats_file.exists():
                stats_file.unlink()
            for s in stats:
                append_stats(stats_file, s)
            (figure,) = plot_adacl_margins(stats_file, work)
            target = out_dir / f"adacl_margins_{label}.png"
            figure.replace(target)
            stats_file.replace(out_dir / f"adacl_margins_{label}.jsonl")
            work.rmdir()
            paths.append(target)
            break
    return paths
