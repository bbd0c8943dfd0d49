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
    """Append one step's ``loss.last_stats`` as a line of the JSON-lines log ``stats_file``.

    Parent directories are created. Values must be JSON-serialisable (``last_stats`` holds only
    numbers, strings, booleans and ``None``); non-finite floats become ``null``.
    """
    if not isinstance(stats, Mapping):
        raise ValueError(f"stats must be a mapping, got {type(stats).__name__}")
    path = Path(stats_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({str(k): _json_safe(v) for k, v in stats.items()}, allow_nan=False)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _number(record: dict, key: str, where: str, *, required: bool) -> float | None:
    value = record.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: missing required key {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def load_stats(stats_file: Path | str) -> list[dict[str, Any]]:
    """Read and validate a stats log; every record gets a numeric ``step``.

    Raises ``FileNotFoundError`` naming a missing file and ``ValueError`` naming ``file:line``
    for a line that is not a JSON object or lacks a numeric ``m1`` / ``m2``, and for a log with
    no records.
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
            for key in ("m1", "m2"):
                _number(record, key, where, required=True)
            _number(record, "anchor", where, required=False)
            _number(record, "clone_count", where, required=False)
            step = _number(record, "step", where, required=False)
            record["step"] = len(records) + 1 if step is None else step
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no stats records (expected one JSON object per line)")
    return records


def plot_adacl_margins(stats_file: Path, out_dir: Path) -> list[Path]:
    """Plot ``m1``, ``m2``, the anchor and ``|S*|`` against the step; return the files written.

    Writes ``out_dir/adacl_margins.png`` (``out_dir`` is created). Steps where a guard kept the
    previous margins are marked with red crosses on the ``m1`` panel. Needs matplotlib (the
    ``plot`` extra); drawn with the Agg backend, without touching pyplot's global state.
    """
    records = load_stats(stats_file)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install 'vlret[plot]'") from err

    steps = [r["step"] for r in records]
    panels: list[tuple[str, str]] = [("m1", "m1 (scale)"), ("m2", "m2 (shift)")]
    panels.append(("anchor", "anchor"))
    has_count = any(r.get("clone_count") is not None for r in records)
    if has_count:
        panels.append(("clone_count", "|S*|"))

    fig = Figure(figsize=(7.0, 2.0 * len(panels) + 0.6))
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
        axes[0].legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("training step")
    fig.suptitle("AdaCL adaptive margins (cf. paper Fig. 3a)")
    fig.tight_layout()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / FIGURE_NAME
    fig.savefig(target, dpi=120)
    return [target]
