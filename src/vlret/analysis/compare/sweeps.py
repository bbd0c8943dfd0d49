"""Sweeps: a grid over loss parameters, run as a comparison, with curves of test rsum against
each parameter (Unified Fig. 5).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...run.config_files import parse_value
from .report import ComparisonReport, add_plot, evaluation_title, write_report
from .runner import run_all
from .spec import (
    CompareError,
    RunSpec,
    Variant,
    check_params,
    eval_settings,
    locked_output,
    make_variant,
    output_folder,
    plan_runs,
    read_compare_config,
)


def parse_param(text: str) -> tuple[str, list[Any]]:
    """``"margin=0,0.1,0.2"`` -> ``("margin", [0, 0.1, 0.2])`` (values typed as in ``--set``)."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise CompareError(f"--param {text!r}: expected NAME=V1,V2,... e.g. margin=0,0.1,0.2")
    items = [v.strip() for v in values.split(",")]
    if not all(items):
        raise CompareError(f"--param {text!r}: empty value in the list")
    parsed = [parse_value(v) for v in items]
    if len({json.dumps(v, sort_keys=True, default=str) for v in parsed}) != len(parsed):
        raise CompareError(f"--param {text!r}: a value is listed twice")
    return name, parsed


def _label_value(v: Any) -> str:
    text = f"{v:g}" if isinstance(v, float) else str(v)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def sweep_variants(base: Variant, grid: dict[str, list[Any]]) -> list[Variant]:
    """The product of ``grid`` over ``base``'s parameters, labelled ``{label}-{name}{value}...``."""
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        point = dict(zip(names, values, strict=True))
        label = base.label + "".join(f"-{n}{_label_value(v)}" for n, v in point.items())
        out.append(Variant(label, base.loss, {**base.params, **point}, base.overrides))
    return out


def sweep(
    config: str | Path,
    *,
    params: Sequence[str],
    loss: str | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    progress: bool = True,
    on_epoch: Callable[[RunSpec, int], None] | None = None,
) -> ComparisonReport:
    """Grid over loss parameters (``params``: ``NAME=V1,V2`` items; their product is run) and
    curves of test rsum against each parameter (Unified Fig. 5), plus the comparison report."""
    if not params:
        raise CompareError("--param: give at least one NAME=V1,V2,... to sweep")
    raw, section = read_compare_config(config, overrides)
    settings = eval_settings(raw, section)
    grid: dict[str, list[Any]] = {}
    for item in params:
        name, values = parse_param(item)
        if name in grid:
            raise CompareError(f"--param {name}: given twice")
        grid[name] = values
    label = loss or (raw.get("loss", {}) or {}).get("name")
    if not label:
        raise CompareError("--loss: no loss given and the config has no [loss] name")
    base = make_variant(label, section.get("losses", {}).get(label, {}), raw)
    check_params(base.label, base.loss, dict.fromkeys(grid), "--param")
    variants = sweep_variants(base, grid)
    n_seeds = seeds if seeds is not None else section.get("seeds", 1)
    with locked_output(output_folder(out, raw, section, "sweep")) as out_dir:
        specs = plan_runs(raw, variants, n_seeds, out_dir)
        outcomes = run_all(specs, settings, progress=progress, on_epoch=on_epoch)
        title = f"{Path(config).stem}: {base.label} sweep, {evaluation_title(outcomes, settings)}"
        report = write_report(
            outcomes,
            out_dir,
            settings,
            title=title,
            extra={"config": str(config), "seeds": n_seeds, "sweep": grid, "loss": base.loss},
        )
        from ..curves import plot_sweep_curves

        points = [
            ({n: s.params[n] for n in grid}, s.mean["rsum"], s.std["rsum"])
            for s in report.summaries
        ]
        add_plot(
            report,
            "sweep curves",
            lambda: plot_sweep_curves(points, list(grid), out_dir / "plots", loss=base.label),
        )
        return report


__all__ = [
    "parse_param",
    "sweep",
    "sweep_variants",
]
