"""AdaCL margins against training steps (the paper's Fig. 3a), from a JSON-lines stats log.

Stats log format (one file per run, written by :func:`append_stats`): UTF-8 text, one JSON
object per line, one line per training step, in step order, each the
:attr:`vlret.losses.AdaCLLoss.last_stats` dict of that step. Keys read here:

* ``m1``, ``m2`` (numbers, required): the margins in use after the step;
* ``step`` (integer, optional): the x coordinate; defaults to the 1-based record number;
* ``anchor`` (number or ``null``): the anchor found that step (``null`` when a guard fired
  before one was found);
* ``clone_count`` (integer, optional): ``|S*|``;
* ``guard`` (string or ``null``, optional): the guard that kept the previous margins.

Other keys are ignored; blank lines are skipped. Non-finite floats are written as ``null``, so
every line is strict JSON.

A training run's own ``metrics.jsonl`` is read too: the trainer logs ``last_stats`` in its
step records under a ``loss_`` prefix (``loss_m1``, ``loss_m2``, ``loss_anchor``, ...), with
the trainer's ``step`` as the x coordinate. Records without margins (epoch records, the steps
of another loss) are skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Name of the figure written by :func:`plot_adacl_margins`.
FIGURE_NAME = "adacl_margins.png"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_stats(stats_file: Path | str, stats: Mapping[str, Any]) -> None:
    """Append one step's ``loss.last_stats`` as a line of a JSON-lines log.

    Parent directories are created; non-finite floats become ``null``.

    Args:
        stats_file: The log.
        stats: JSON-serialisable values (``last_stats`` holds only numbers, strings, booleans
            and None).

    Raises:
        ValueError: ``stats`` is not a mapping.
    """
    if not isinstance(stats, Mapping):
        raise ValueError(f"stats must be a mapping, got {type(stats).__name__}")
    path = Path(stats_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({str(k): _json_safe(v) for k, v in stats.items()}, allow_nan=False)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _number(
    record: dict, key: str, where: str, *, required: bool, prefix: str = ""
) -> float | None:
    """``record[key]`` as a float; errors name the key as the file spells it (``prefix``)."""
    value = record.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: missing required key {prefix + key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {prefix + key!r} must be a number, got {value!r}")
    return float(value)


#: Prefix of ``last_stats`` keys in the trainer's step records.
TRAINER_PREFIX = "loss_"


def _margins_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """The stats of a record in either form (``m1`` or the trainer's ``loss_m1``); ``None``
    for a record without margins."""
    if "m1" in record or "m2" in record:
        return record
    if f"{TRAINER_PREFIX}m1" in record or f"{TRAINER_PREFIX}m2" in record:
        n = len(TRAINER_PREFIX)
        stats = {k[n:]: v for k, v in record.items() if k.startswith(TRAINER_PREFIX)}
        stats["step"] = record.get("step")  # the trainer's step, not the loss's own count
        return stats
    return None


def load_stats(stats_file: Path | str) -> list[dict[str, Any]]:
    """Read and validate a stats log (or a run's ``metrics.jsonl``).

    Args:
        stats_file: The log.

    Returns:
        The records with margins, each with a numeric ``step``.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: A line (named ``file:line``) is not a JSON object or has only one of the
            margins or a non-numeric one, or no record has margins.
    """
    path = Path(stats_file)
    if not path.is_file():
        raise FileNotFoundError(f"AdaCL stats file not found: {path}")
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            stats = _margins_record(record)
            if stats is None:
                continue
            prefix = "" if stats is record else TRAINER_PREFIX
            for key in ("m1", "m2", "anchor", "clone_count"):
                _number(stats, key, where, required=key in ("m1", "m2"), prefix=prefix)
            step = _number(stats, "step", where, required=False)
            stats["step"] = len(records) + 1 if step is None else step
            records.append(stats)
    if not records:
        raise ValueError(
            f"{path}: no stats records with AdaCL margins (expected m1 and m2 per line, or "
            "loss_m1 and loss_m2 in the step records of an AdaCL run's metrics.jsonl)"
        )
    return records


def plot_adacl_margins(stats_file: Path, out_dir: Path) -> list[Path]:
    """Plot ``m1``, ``m2``, the anchor similarity and ``|S*|`` against the step (AdaCL Fig. 3a).

    Steps where a guard kept the previous margins are marked with red crosses on the ``m1``
    panel. Drawn with the Agg backend, without touching pyplot's global state.

    Args:
        stats_file: A stats log or a run's ``metrics.jsonl`` (:func:`load_stats`).
        out_dir: The folder (created if needed).

    Returns:
        The files written (``out_dir/adacl_margins.png``).

    Raises:
        MissingExtra: matplotlib is not installed (the ``plot`` extra).
        FileNotFoundError: ``stats_file`` is missing.
        ValueError: The log is invalid (:func:`load_stats`).
    """
    records = load_stats(stats_file)
    from ._plotting import legend_outside, require_matplotlib, save_figure

    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [r["step"] for r in records]
    panels: list[tuple[str, str]] = [("m1", "m1 (scale)"), ("m2", "m2 (shift)")]
    panels.append(("anchor", "anchor"))
    has_count = any(r.get("clone_count") is not None for r in records)
    if has_count:
        panels.append(("clone_count", "|S*|"))

    fig = Figure(figsize=(7.0, 2.0 * len(panels) + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, label) in zip(axes, panels, strict=True):
        points = [
            (x, r[key]) for x, r in zip(steps, records, strict=True) if r.get(key) is not None
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, lw=1.2, marker="." if len(points) < 50 else None)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    guarded = [(x, r["m1"]) for x, r in zip(steps, records, strict=True) if r.get("guard")]
    if guarded:
        gx, gy = zip(*guarded, strict=True)
        axes[0].scatter(gx, gy, marker="x", color="tab:red", zorder=3, label="guard kept margins")
        legend_outside(fig, *axes[0].get_legend_handles_labels())  # under the panels
    axes[-1].set_xlabel("training step")
    fig.suptitle("AdaCL adaptive margins (cf. paper Fig. 3a)")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [save_figure(fig, out / FIGURE_NAME, dpi=120)]
