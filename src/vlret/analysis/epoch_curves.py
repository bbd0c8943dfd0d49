"""Curves of the dev metrics against epochs, from the runs' ``metrics.jsonl`` logs.

* :func:`plot_r1_curves`: dev R@1 per direction against epochs, one line per loss (AdaCL
  Fig. 7: the training efficiency of a loss is how fast R@1 rises); the mean over seeds with
  a min-max band. ``vlret compare`` writes it under ``plots/``.
* :func:`plot_run_curves`: the figure of ``vlret plot curves RUN [RUN ...]``: the training
  loss and the dev loss (absolute values), the dev selection metric (rsum unless
  ``train.select_on`` named another) and dev R@1 per direction, one colour per run.

The R@1 keys (:func:`r1_keys`) are the image-level ``dev_i2t_r1`` / ``dev_t2i_r1`` of every
run's epoch records, or on person search the identity-level ``dev_identity_i2t_r1`` /
``dev_identity_t2i_r1``
(any image of the caption's person counts, the R@1 the person-search papers report).
Epochs are numbered from 0, as the console and ``metrics.jsonl`` number them; each figure has
one legend, under its panels (:func:`._plotting.legend_outside`). matplotlib (the ``plot``
extra) is imported inside each function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._plotting import legend_outside, new_figure, save_figure, series_styles
from .curves import _draw, _epoch_axes, _key, epoch_series, read_metrics_log, selection_key

#: File written by :func:`plot_r1_curves`.
R1_FIGURE = "curves_r1.png"
#: File written by :func:`plot_run_curves` (``vlret plot curves``).
RUN_FIGURE = "training_curves.png"
#: The two directions, as titled on the figures.
DIRECTIONS = ("I->T", "T->I")


def r1_keys(records: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The epoch-record keys of dev R@1, image-to-text then text-to-image: the person-search
    identity-level ``dev_identity_i2t_r1`` / ``dev_identity_t2i_r1`` when the run logged them
    (older logs' ``dev_t2i_R1`` read as such by :func:`~vlret.analysis.curves.read_metrics_log`),
    else ``dev_i2t_r1`` / ``dev_t2i_r1``."""
    for rec in records:
        if rec.get("kind") == "epoch" and "dev_identity_t2i_r1" in rec:
            return ("dev_identity_i2t_r1", "dev_identity_t2i_r1")
    return ("dev_i2t_r1", "dev_t2i_r1")


def _logs(runs: Mapping[str, Sequence[str | Path]]) -> dict[str, list[list[dict[str, Any]]]]:
    return {label: [read_metrics_log(d) for d in dirs] for label, dirs in runs.items()}


def plot_r1_curves(runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path) -> Path:
    """Draw dev R@1 against epochs, image-to-text and text-to-image side by side (AdaCL
    Fig. 7), one line per label.

    Args:
        runs: Label -> the run folders of its seeds; one colour per label on both panels.
        out_dir: The folder of the figure.

    Returns:
        The path of ``curves_r1.png``.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
        ImportError: matplotlib is not installed.
    """
    logs = _logs(runs)
    fig = new_figure((11.0, 4.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    styles = series_styles(len(logs))
    for (color, marker), (label, recs) in zip(styles, logs.items(), strict=True):
        keys = r1_keys([r for run in recs for r in run])
        for ax, key in zip(axes, keys, strict=True):
            series = [epoch_series(r, key) for r in recs]
            _draw(ax, series, label=label, color=color, marker=marker)
    for ax, direction in zip(axes, DIRECTIONS, strict=True):
        ax.set_title(f"dev {direction} R@1")
        ax.set_ylabel("R@1 (%)")
    _epoch_axes(axes)
    if logs:
        legend_outside(fig, [_key(c, m) for c, m in styles], list(logs))
    fig.suptitle("Dev R@1 against epochs (cf. AdaCL Fig. 7)")
    return save_figure(fig, Path(out_dir) / R1_FIGURE)


def run_labels(run_dirs: Sequence[str | Path]) -> dict[str, Path]:
    """A label per run folder: its name, or its path where two runs share a name.

    Raises:
        ValueError: The same folder twice.
    """
    paths = [Path(d) for d in run_dirs]
    resolved = [p.resolve() for p in paths]
    if len(set(resolved)) != len(resolved):
        twice = next(p for p, r in zip(paths, resolved, strict=True) if resolved.count(r) > 1)
        raise ValueError(f"{twice}: the same run folder is given twice")
    names = [p.name or str(p) for p in paths]
    return {
        (name if names.count(name) == 1 else str(p)): p
        for name, p in zip(names, paths, strict=True)
    }


def plot_run_curves(run_dirs: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Draw the curves of ``vlret plot curves``: training loss (solid) and dev loss (dashed),
    the dev selection metric, and dev R@1 per direction (I->T solid, T->I dashed), against
    epochs, one colour per run (:func:`run_labels`).

    Args:
        run_dirs: Run folders (each holding ``metrics.jsonl``).
        out_dir: The folder of the figure.

    Returns:
        The path of ``training_curves.png``.

    Raises:
        FileNotFoundError: A run folder has no ``metrics.jsonl``.
        ValueError: A log holds no epoch record yet, or a folder is given twice.
        ImportError: matplotlib is not installed.
    """
    labels = run_labels(run_dirs)
    logs = {}
    for label, path in labels.items():
        recs = read_metrics_log(path)
        if not any(r.get("kind") == "epoch" for r in recs):
            log = path / "metrics.jsonl" if path.is_dir() else path
            raise ValueError(f"{log}: no epoch record yet (the run has not finished an epoch)")
        logs[label] = recs
    fig = new_figure((15.0, 5.0), layout="constrained")
    ax_loss, ax_sel, ax_r1 = fig.subplots(1, 3)
    selected = set()
    styles = series_styles(len(logs))
    for (color, marker), (label, recs) in zip(styles, logs.items(), strict=True):
        look = {"color": color, "marker": marker}
        _draw(ax_loss, [epoch_series(recs, "train_loss")], label=f"{label} train", **look)
        dev = epoch_series(recs, "dev_loss")
        _draw(ax_loss, [dev], label=f"{label} dev", style="--", **look)
        key = selection_key(recs)
        selected.add(key[len("dev_") :])
        _draw(ax_sel, [epoch_series(recs, key)], label=label, **look)
        for key, direction, line in zip(r1_keys(recs), DIRECTIONS, ("-", "--"), strict=True):
            series = [epoch_series(recs, key)]
            _draw(ax_r1, series, label=f"{label} {direction}", style=line, **look)
    name = selected.pop() if len(selected) == 1 else "selection metric"
    for ax, title in (
        (ax_loss, "loss: training (solid), dev (dashed)"),
        (ax_sel, f"dev {name}"),
        (ax_r1, "dev R@1: I->T (solid), T->I (dashed)"),
    ):
        ax.set_title(title, fontsize=10)
    _epoch_axes((ax_loss, ax_sel, ax_r1))
    legend_outside(fig, [_key(c, m) for c, m in styles], list(logs))
    ax_loss.set_ylabel("loss")
    ax_sel.set_ylabel(name)
    ax_r1.set_ylabel("R@1 (%)")
    fig.suptitle("Training curves (cf. Unified Fig. 3, AdaCL Fig. 7)")
    return save_figure(fig, Path(out_dir) / RUN_FIGURE)


__all__ = [
    "DIRECTIONS",
    "R1_FIGURE",
    "RUN_FIGURE",
    "plot_r1_curves",
    "plot_run_curves",
    "r1_keys",
    "run_labels",
]
