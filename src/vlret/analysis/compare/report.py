"""The report of a comparison: tables, curves and plots, and :func:`compare` itself."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._files import atomic_write_text
from ..tables import (
    VariantSummary,
    goal_grid_markdown,
    summarize,
    write_results_csv,
    write_results_json,
    write_table,
)
from .runner import RunOutcome, run_all
from .spec import (
    EvalSettings,
    RunSpec,
    eval_settings,
    locked_output,
    output_folder,
    plan_runs,
    read_compare_config,
    resolve_variants,
)


@dataclass
class ComparisonReport:
    out_dir: Path
    table: Path
    results_csv: Path
    results_json: Path
    summaries: list[VariantSummary]
    outcomes: list[RunOutcome]
    plots: list[Path] = field(default_factory=list)
    goal_table: Path | None = None
    #: ``curves.md``: dev rsum, dev loss, dev R@1 per direction and dev similarities against
    #: epochs (mean +- std over seeds).
    curves: Path | None = None
    warnings: list[str] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    def table_text(self) -> str:
        return self.table.read_text(encoding="utf-8")


def _runs_by_label(outcomes: Sequence[RunOutcome]) -> dict[str, list[Path]]:
    runs: dict[str, list[Path]] = {}
    for o in outcomes:
        if (o.spec.run_dir / "metrics.jsonl").is_file():
            runs.setdefault(o.spec.variant.label, []).append(o.spec.run_dir)
    return runs


def _logs_margins(run_dir: Path) -> bool:
    from ..curves import adacl_stats_from_log, read_metrics_log

    return bool(adacl_stats_from_log(read_metrics_log(run_dir)))


def training_steps(runs: Mapping[str, Sequence[Path]]) -> dict[str, list[int]]:
    """Each variant's optimisation steps per run (the last ``step`` of its ``metrics.jsonl``;
    a run that starts from another run's weights, ``train.init_from``, counts its own)."""
    from ..curves import read_metrics_log

    steps: dict[str, list[int]] = {}
    for label, dirs in runs.items():
        for d in dirs:
            last = [int(r["step"]) for r in read_metrics_log(d) if "step" in r]
            if last:
                steps.setdefault(label, []).append(max(last))
    return steps


def budget_note(steps: Mapping[str, Sequence[int]]) -> str | None:
    """One markdown paragraph naming each variant's training steps when they differ between
    variants (a comparison of losses at unequal budgets is easy to misread: issue 43 found
    pseudo-caption rows that trained 45% of their twins' steps), else ``None``."""
    per_variant = {label: sorted(set(v)) for label, v in steps.items() if v}
    if len({tuple(v) for v in per_variant.values()}) <= 1:
        return None
    listed = ", ".join(
        f"{label} {'/'.join(str(n) for n in v)}" for label, v in sorted(per_variant.items())
    )
    return (
        f"\n**The variants trained for different numbers of steps**: {listed} (each run's "
        "last step in its metrics.jsonl; a run started from another run's weights counts "
        "its own). Compare them knowing this.\n"
    )


def add_plot(report: ComparisonReport, what: str, fn: Callable[[], Any]) -> None:
    """Add the plot(s) ``fn`` makes to ``report``; a missing plotting library is a warning."""
    try:
        made = fn()
    except ImportError as err:
        report.warnings.append(f"{what} skipped: {err}")
        return
    report.plots.extend(made if isinstance(made, list) else [made])


def evaluation_title(outcomes: Sequence[RunOutcome], settings: EvalSettings) -> str:
    """What the runs were tested on, titled as ``vlret eval`` titles it (the protocol's paper
    label only on the paper's test set, else the split and its sizes); the protocol and split
    names when no run recorded a title (results written before titles were recorded)."""
    for outcome in outcomes:
        if outcome.result.title:
            return outcome.result.title
    return f"{settings.protocol} {settings.split}"


def write_report(
    outcomes: Sequence[RunOutcome],
    out_dir: Path,
    settings: EvalSettings,
    *,
    title: str,
    goal_grid: bool = False,
    extra: dict[str, Any] | None = None,
) -> ComparisonReport:
    """``table.md``, ``results.csv``, ``results.json``, ``curves.md`` (dev rsum, dev loss, dev
    R@1 per direction and dev similarities against epochs), and the training (with the dev
    loss) / dev R@1 / similarity / AdaCL / GOAL-grid plots under ``plots/``."""
    from ..curves import (
        plot_adacl_trajectories,
        plot_similarity_curves,
        plot_training_curves,
        write_epoch_curves,
    )
    from ..epoch_curves import plot_r1_curves
    from ..goal_plots import plot_goal_heatmap

    summaries = summarize(o.result for o in outcomes)
    report = ComparisonReport(
        out_dir=out_dir,
        table=write_table(summaries, out_dir / "table.md", title=title),
        results_csv=write_results_csv(summaries, out_dir / "results.csv"),
        results_json=write_results_json(
            summaries,
            out_dir / "results.json",
            protocol=settings.protocol,
            split=settings.split,
            checkpoint=settings.checkpoint,
            **(extra or {}),
        ),
        summaries=summaries,
        outcomes=list(outcomes),
    )
    plots = out_dir / "plots"
    runs = _runs_by_label(outcomes)
    note = budget_note(training_steps(runs))
    if note is not None:
        atomic_write_text(report.table, report.table_text() + note)
        report.warnings.append(note.strip().replace("**", ""))
    if runs:
        report.curves = write_epoch_curves(runs, out_dir)
        add_plot(report, "training curves", lambda: plot_training_curves(runs, plots))
        add_plot(report, "dev R@1 curves", lambda: plot_r1_curves(runs, plots))
        add_plot(report, "similarity curves", lambda: plot_similarity_curves(runs, plots))
        # the runs whose loss logged AdaCL's margins (its last_stats, in the step records)
        adacl_runs = {k: v for k, v in runs.items() if any(map(_logs_margins, v))}
        if adacl_runs:
            add_plot(report, "AdaCL margins", lambda: plot_adacl_trajectories(adacl_runs, plots))
    if goal_grid:
        from ...losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS

        report.goal_table = out_dir / "goal_grid.md"
        atomic_write_text(
            report.goal_table,
            goal_grid_markdown(
                summaries, triplet_weights=TRIPLET_WEIGHTS, pair_weights=PAIR_WEIGHTS
            ),
        )
        cells: dict[tuple[str, str], Mapping[str, float]] = {}
        for s in summaries:
            if s.loss == "goal" and s.label.startswith("goal-"):
                cells.setdefault((s.params["triplet_weight"], s.params["pair_weight"]), s.mean)
        add_plot(
            report,
            "GOAL heatmap",
            lambda: plot_goal_heatmap(
                cells, plots, triplet_weights=TRIPLET_WEIGHTS, pair_weights=PAIR_WEIGHTS
            ),
        )
    for w in report.warnings:
        warnings.warn(w, stacklevel=2)
    return report


def compare(
    config: str | Path,
    *,
    losses: Sequence[str] | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    goal_grid: bool = False,
    overrides: Sequence[str] | None = None,
    progress: bool = True,
    on_epoch: Callable[[RunSpec, int], None] | None = None,
) -> ComparisonReport:
    """Train every variant x seed of ``config`` (resuming unfinished runs), test each, and write
    the tables and plots to ``out``; see the module docstring."""
    raw, section = read_compare_config(config, overrides)
    settings = eval_settings(raw, section)
    variants = resolve_variants(raw, section, losses, goal_grid=goal_grid)
    n_seeds = seeds if seeds is not None else section.get("seeds", 1)
    with locked_output(output_folder(out, raw, section, "compare")) as out_dir:
        specs = plan_runs(raw, variants, n_seeds, out_dir)
        outcomes = run_all(specs, settings, progress=progress, on_epoch=on_epoch)
        title = f"{Path(config).stem}: {evaluation_title(outcomes, settings)}"
        return write_report(
            outcomes,
            out_dir,
            settings,
            title=title,
            goal_grid=goal_grid,
            extra={"config": str(config), "seeds": n_seeds},
        )


__all__ = [
    "ComparisonReport",
    "add_plot",
    "budget_note",
    "compare",
    "evaluation_title",
    "training_steps",
    "write_report",
]
