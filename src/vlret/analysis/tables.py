"""Paper-style result tables of a loss comparison: ``table.md``, ``results.csv``, ``results.json``.

The input is one :class:`RunResult` per (variant, seed); :func:`summarize` groups them by
variant into :class:`VariantSummary` (mean and sample standard deviation over seeds, ``ddof =
1``, 0 for a single seed). :func:`markdown_table` renders the papers' layout: R@1/5/10 image to
text, R@1/5/10 text to image, rsum, each cell ``mean +- std``, the best mean of each column in
bold (every variant whose mean rounds to the best shown value, so visible ties are all bold).

Runs tested under a person-search protocol (``cuhk-pedes``, ``icfg-pedes``, ``rstpreid``: an
:class:`~vlret.metrics.IdentityMetrics`, every image of the person relevant) carry the
identity-level metrics instead (:data:`IDENTITY_COLUMNS`: T→I then I→T R@1, R@5, R@10, mAP and
mINP, IRRA's order); :func:`markdown_table` then renders those columns, and ``results.csv`` /
``results.json`` hold those keys.

Runs tested on a synthetic world (:mod:`vlret.worlds`) also carry the metrics of
:data:`SYNTHETIC_COLUMNS` (clone forced choice, R-Precision / mAP@R on the exhaustive
relevance, text-to-image R@1 of the secondary-content captions); they get the same treatment
in a second table of ``table.md`` (:func:`synthetic_markdown_table`), and extra columns in
``results.csv`` / ``results.json`` when any run has them.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import atomic_write_text
from ..metrics.keys import RETRIEVAL_METRIC_KEYS

#: Table columns in the papers' order, with their header labels.
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("i2t_r1", "R@1"),
    ("i2t_r5", "R@5"),
    ("i2t_r10", "R@10"),
    ("t2i_r1", "R@1"),
    ("t2i_r5", "R@5"),
    ("t2i_r10", "R@10"),
    ("rsum", "rsum"),
)
#: Every metric written to the CSV / JSON (lower is better for the rank columns): the keys of
#: :meth:`~vlret.metrics.RetrievalMetrics.as_dict`.
METRIC_KEYS: tuple[str, ...] = RETRIEVAL_METRIC_KEYS
#: The synthetic world's extra metrics (percent, higher is better) with their header labels.
SYNTHETIC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("clone_t2i", "Clone T→I"),
    ("clone_i2t", "Clone I→T"),
    ("t2i_rprecision", "T→I R-Prec"),
    ("t2i_map_at_r", "T→I mAP@R"),
    ("i2t_rprecision", "I→T R-Prec"),
    ("i2t_map_at_r", "I→T mAP@R"),
    ("secondary_t2i_r1", "Secondary T→I R@1"),
)
#: Standard recall of query subsets of the synthetic world (percent; see
#: :func:`vlret.worlds.evaluate_synthetic`): captions of a secondary object alone or of
#: the primary object alone, and the queries of images in a clone group or in none.
SUBSET_COLUMNS: tuple[tuple[str, str], ...] = (
    ("secondary_t2i_r5", "Secondary T→I R@5"),
    ("secondary_t2i_r10", "Secondary T→I R@10"),
    ("primary_t2i_r1", "Primary T→I R@1"),
    ("primary_t2i_r5", "Primary T→I R@5"),
    ("clone_group_t2i_r1", "Clone-group T→I R@1"),
    ("clone_group_t2i_r5", "Clone-group T→I R@5"),
    ("clone_group_i2t_r1", "Clone-group I→T R@1"),
    ("clone_group_i2t_r5", "Clone-group I→T R@5"),
    ("no_clone_t2i_r1", "No-clone T→I R@1"),
    ("no_clone_i2t_r1", "No-clone I→T R@1"),
)
SYNTHETIC_KEYS: tuple[str, ...] = tuple(k for k, _ in SYNTHETIC_COLUMNS + SUBSET_COLUMNS)
#: The identity-level metrics of the person-search protocols (percent, higher is better; the
#: keys of :meth:`vlret.metrics.IdentityMetrics.as_dict`), text to image first as IRRA
#: reports them, with their header labels.
IDENTITY_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (f"identity_{d}_{k}", f"{arrow} {label}")
    for d, arrow in (("t2i", "T→I"), ("i2t", "I→T"))
    for k, label in (
        ("r1", "R@1"),
        ("r5", "R@5"),
        ("r10", "R@10"),
        ("map", "mAP"),
        ("minp", "mINP"),
    )
)
IDENTITY_KEYS: tuple[str, ...] = tuple(k for k, _ in IDENTITY_COLUMNS)


@dataclass(frozen=True)
class RunResult:
    """Test metrics of one trained run.

    Attributes:
        label: The variant's label (a loss with its parameters).
        loss: The registered loss name.
        seed: The run's seed.
        metrics: Metric name -> value (:data:`METRIC_KEYS`, :data:`SYNTHETIC_KEYS`; person
            search: :data:`IDENTITY_KEYS`).
        params: The loss parameters.
        run_dir: The run's folder.
        title: The evaluation's table title (:meth:`vlret.eval.EvalProtocol.title_for`: the
            paper's label only on the paper's test set); empty when unknown.
    """

    label: str
    loss: str
    seed: int
    metrics: Mapping[str, float]
    params: Mapping[str, Any] = field(default_factory=dict)
    run_dir: str = ""
    title: str = ""


@dataclass(frozen=True)
class VariantSummary:
    """All seeds of one variant (a loss with its parameters) and their mean / std."""

    label: str
    loss: str
    params: Mapping[str, Any]
    runs: tuple[RunResult, ...]
    mean: Mapping[str, float]
    std: Mapping[str, float]

    @property
    def seeds(self) -> list[int]:
        """The seeds of the runs, ascending."""
        return [r.seed for r in self.runs]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation.

    Args:
        values: At least one value.

    Returns:
        ``(mean, std)`` with ``ddof = 1``; std is 0 for a single value.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("mean_std needs at least one value")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def summarize(results: Iterable[RunResult]) -> list[VariantSummary]:
    """Group runs by label and compute mean / std of every metric all the runs have.

    Args:
        results: The runs.

    Returns:
        One summary per label, in first-seen order; runs sorted by seed.
    """
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.label, []).append(r)
    out = []
    for label, runs in groups.items():
        runs = sorted(runs, key=lambda r: r.seed)
        known = METRIC_KEYS + IDENTITY_KEYS + SYNTHETIC_KEYS
        keys = [k for k in known if all(k in r.metrics for r in runs)]
        stats = {k: mean_std([float(r.metrics[k]) for r in runs]) for k in keys}
        out.append(
            VariantSummary(
                label=label,
                loss=runs[0].loss,
                params=dict(runs[0].params),
                runs=tuple(runs),
                mean={k: s[0] for k, s in stats.items()},
                std={k: s[1] for k, s in stats.items()},
            )
        )
    return out


def _cell(mean: float, std: float, n_seeds: int, digits: int) -> str:
    if n_seeds < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def best_labels(summaries: Sequence[VariantSummary], key: str, *, digits: int = 1) -> set[str]:
    """Labels whose mean of ``key`` equals the best one at the displayed precision.

    Args:
        summaries: The variants.
        key: A metric; ranks (``medr``, ``meanr``) are better lower, the others higher.
        digits: Decimals displayed.

    Returns:
        The best labels (ties included); empty when no variant has ``key``.
    """
    shown = {s.label: round(s.mean[key], digits) for s in summaries if key in s.mean}
    if not shown:
        return set()
    lower_better = key.endswith(("medr", "meanr"))
    best = min(shown.values()) if lower_better else max(shown.values())
    return {label for label, v in shown.items() if v == best}


def _seeds_note(summaries: Sequence[VariantSummary]) -> str:
    counts = [len(s.runs) for s in summaries]
    if max(counts) < 2:
        return "one seed"
    if len(set(counts)) == 1:
        return f"mean ± sample std over {counts[0]} seeds"
    return "mean ± sample std over seeds (seed counts differ: see results.csv)"


def _table_rows(
    summaries: Sequence[VariantSummary],
    columns: Sequence[tuple[str, str]],
    header: Sequence[str],
    digits: int,
) -> list[str]:
    """Header, alignment and one row per variant; ``-`` where a variant lacks a metric."""
    best = {key: best_labels(summaries, key, digits=digits) for key, _ in columns}
    lines = ["| " + " | ".join(["Loss", *header]) + " |"]
    lines.append("|" + "|".join([":---"] + ["---:"] * len(columns)) + "|")
    for s in summaries:
        cells = [s.label]
        for key, _ in columns:
            if key not in s.mean:
                cells.append("-")
                continue
            text = _cell(s.mean[key], s.std[key], len(s.runs), digits)
            cells.append(f"**{text}**" if s.label in best[key] else text)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def has_identity_metrics(summaries: Sequence[VariantSummary]) -> bool:
    """Whether the runs of ``summaries`` were tested under a person-search protocol (any run
    carries an identity-level metric, :data:`IDENTITY_KEYS`)."""
    return any(k in r.metrics for s in summaries for r in s.runs for k in IDENTITY_KEYS)


def metric_keys(summaries: Sequence[VariantSummary]) -> tuple[str, ...]:
    """The test metrics of ``summaries``' runs: :data:`IDENTITY_KEYS` for person search, else
    :data:`METRIC_KEYS`; then :data:`SYNTHETIC_KEYS` when any run has a synthetic-world metric."""
    keys = IDENTITY_KEYS if has_identity_metrics(summaries) else METRIC_KEYS
    return keys + (SYNTHETIC_KEYS if has_synthetic_metrics(summaries) else ())


def markdown_table(summaries: Sequence[VariantSummary], *, title: str = "", digits: int = 1) -> str:
    """The paper-style markdown table (see the module docstring): the caption-level recalls
    and rsum, or for runs tested under a person-search protocol the identity-level
    :data:`IDENTITY_COLUMNS`.

    Args:
        summaries: The variants, one row each.
        title: A ``###`` heading; none when empty.
        digits: Decimals displayed.

    Returns:
        The table as markdown.

    Raises:
        ValueError: ``summaries`` is empty.
    """
    if not summaries:
        raise ValueError("markdown_table needs at least one variant")
    lines = []
    if title:
        lines += [f"### {title}", ""]
    if has_identity_metrics(summaries):
        lines.append(
            "Text → Image: columns 2-6; Image → Text: columns 7-11; identity level (every "
            f"image of the person is relevant), percent; {_seeds_note(summaries)}."
        )
        lines.append("")
        header = [h for _, h in IDENTITY_COLUMNS]
        lines += _table_rows(summaries, IDENTITY_COLUMNS, header, digits)
        return "\n".join(lines) + "\n"
    lines.append(f"Image → Text: columns 2-4; Text → Image: columns 5-7; {_seeds_note(summaries)}.")
    lines.append("")
    header = [
        f"{'I→T' if k.startswith('i2t') else 'T→I' if k.startswith('t2i') else ''} {name}".strip()
        for k, name in TABLE_COLUMNS
    ]
    lines += _table_rows(summaries, TABLE_COLUMNS, header, digits)
    return "\n".join(lines) + "\n"


def has_synthetic_metrics(summaries: Sequence[VariantSummary]) -> bool:
    """Whether any run of ``summaries`` carries a synthetic-world metric."""
    return any(k in r.metrics for s in summaries for r in s.runs for k in SYNTHETIC_KEYS)


def _extras_table(
    summaries: Sequence[VariantSummary],
    columns: Sequence[tuple[str, str]],
    caption: str,
    *,
    name: str,
    title: str,
    digits: int,
) -> str:
    """``columns`` of ``summaries`` as a table like :func:`markdown_table` under ``caption``."""
    if not summaries:
        raise ValueError(f"{name} needs at least one variant")
    lines = [f"### {title}", ""] if title else []
    lines += [f"{caption}; percent, {_seeds_note(summaries)}.", ""]
    lines += _table_rows(summaries, columns, [h for _, h in columns], digits)
    return "\n".join(lines) + "\n"


_SYNTHETIC_CAPTION = (
    "Synthetic world, same test split: clone forced choice (a caption picks its image over "
    "a one-edit sibling it does not describe, and an image its caption over the sibling's; "
    "chance 50), R-Precision and mAP@R on the exhaustive relevance, and T→I R@1 of the "
    "captions that mention only a secondary object"
)
_SUBSET_CAPTION = (
    "Synthetic world, same test split, standard recall of query subsets: T→I of the "
    "captions that mention only a secondary object / only the primary object, and both "
    "directions for the images in a clone group (and their captions) / in none; every "
    "image or caption stays a candidate"
)


def synthetic_markdown_table(
    summaries: Sequence[VariantSummary], *, title: str = "", digits: int = 1
) -> str:
    """The synthetic world's extras (:data:`SYNTHETIC_COLUMNS`) as a table.

    Laid out like :func:`markdown_table`: ``mean +- std`` over seeds, the best of each column
    in bold; arguments and errors as there.
    """
    name = "synthetic_markdown_table"
    columns, caption = SYNTHETIC_COLUMNS, _SYNTHETIC_CAPTION
    return _extras_table(summaries, columns, caption, name=name, title=title, digits=digits)


def subset_markdown_table(
    summaries: Sequence[VariantSummary], *, title: str = "", digits: int = 1
) -> str:
    """The query subsets' recalls (:data:`SUBSET_COLUMNS`) as a table.

    Laid out like :func:`markdown_table`; arguments and errors as there.
    """
    name, columns, caption = "subset_markdown_table", SUBSET_COLUMNS, _SUBSET_CAPTION
    return _extras_table(summaries, columns, caption, name=name, title=title, digits=digits)


def goal_grid_markdown(
    summaries: Sequence[VariantSummary],
    *,
    triplet_weights: Sequence[str],
    pair_weights: Sequence[str],
    digits: int = 1,
) -> str:
    """GOAL Tables 3-5 layout: rows triplet weight, columns pair weight.

    Each cell is ``i2t R@1 / t2i R@1 (rsum)`` (means over seeds); the best of each of the
    three numbers in bold. Variants are matched by ``params["triplet_weight"]`` /
    ``params["pair_weight"]`` of GOAL runs; a missing combination shows ``-``.

    Args:
        summaries: The variants (non-GOAL ones are ignored).
        triplet_weights: The row order.
        pair_weights: The column order.
        digits: Decimals displayed.

    Returns:
        The table as markdown.
    """
    cells: dict[tuple[str, str], VariantSummary] = {}
    for s in summaries:
        if s.loss == "goal":
            key = (str(s.params.get("triplet_weight")), str(s.params.get("pair_weight")))
            cells.setdefault(key, s)
    present = list(cells.values())
    best = {k: best_labels(present, k, digits=digits) for k in ("i2t_r1", "t2i_r1", "rsum")}

    def fmt(s: VariantSummary, key: str) -> str:
        text = f"{s.mean[key]:.{digits}f}"
        return f"**{text}**" if s.label in best[key] else text

    lines = [
        "GOAL combinations: I→T R@1 / T→I R@1 (rsum), mean over seeds; rows: triplet weight T, "
        "columns: pair weight P.",
        "",
        "| T \\ P | " + " | ".join(pair_weights) + " |",
        "|:---|" + "|".join(["---:"] * len(pair_weights)) + "|",
    ]
    for t in triplet_weights:
        row = [t]
        for p in pair_weights:
            cell = cells.get((t, p))
            row.append(
                "-"
                if cell is None
                else f"{fmt(cell, 'i2t_r1')} / {fmt(cell, 't2i_r1')} ({fmt(cell, 'rsum')})"
            )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def results_record(summaries: Sequence[VariantSummary], **extra: Any) -> dict[str, Any]:
    """The ``results.json`` document (non-finite numbers become ``null``).

    Args:
        summaries: The variants.
        **extra: Top-level keys written first.

    Returns:
        ``extra``'s keys, then ``variants``: one entry per variant with its parameters,
        per-seed metrics, mean and std.
    """
    return _plain(
        {
            **extra,
            "variants": [
                {
                    "label": s.label,
                    "loss": s.loss,
                    "params": dict(s.params),
                    "seeds": s.seeds,
                    "runs": [
                        {"seed": r.seed, "run_dir": r.run_dir, "metrics": dict(r.metrics)}
                        for r in s.runs
                    ],
                    "mean": dict(s.mean),
                    "std": dict(s.std),
                }
                for s in summaries
            ],
        }
    )


def write_results_json(summaries: Sequence[VariantSummary], path: str | Path, **extra: Any) -> Path:
    """Write :func:`results_record` as JSON to ``path`` (atomically) and return the path."""
    return atomic_write_text(path, json.dumps(results_record(summaries, **extra), indent=2) + "\n")


def write_results_csv(summaries: Sequence[VariantSummary], path: str | Path) -> Path:
    """Write ``results.csv`` (atomically).

    One row per run (``seed`` = the seed) then a ``mean`` and a ``std`` row per variant;
    columns: label, loss, seed, params (JSON), then :func:`metric_keys`: :data:`METRIC_KEYS`
    (person search: :data:`IDENTITY_KEYS`), and :data:`SYNTHETIC_KEYS` when any run has a
    synthetic-world metric.

    Args:
        summaries: The variants.
        path: The CSV file.

    Returns:
        ``path``.
    """
    keys = metric_keys(summaries)
    fh = io.StringIO(newline="")
    writer = csv.writer(fh)
    writer.writerow(["label", "loss", "seed", "params", *keys])
    for s in summaries:
        params = json.dumps(_plain(dict(s.params)), sort_keys=True)
        for r in s.runs:
            row = [r.metrics.get(k, "") for k in keys]
            writer.writerow([s.label, s.loss, r.seed, params, *row])
        for name, stats in (("mean", s.mean), ("std", s.std)):
            writer.writerow([s.label, s.loss, name, params, *[stats.get(k, "") for k in keys]])
    return atomic_write_text(path, fh.getvalue())


def write_table(
    summaries: Sequence[VariantSummary], path: str | Path, *, title: str = "", digits: int = 1
) -> Path:
    """Write ``table.md`` (atomically).

    The paper-style table, then the synthetic extras' table and the query subsets' table when
    any run has them.

    Args:
        summaries: The variants.
        path: The markdown file.
        title: Heading of the tables.
        digits: Decimals displayed.

    Returns:
        ``path``.
    """
    text = markdown_table(summaries, title=title, digits=digits)
    if has_synthetic_metrics(summaries):
        extras_title = f"{title}: synthetic-world extras" if title else ""
        text += "\n" + synthetic_markdown_table(summaries, title=extras_title, digits=digits)
        if any(k in s.mean for s in summaries for k, _ in SUBSET_COLUMNS):
            subset_title = f"{title}: query subsets" if title else ""
            text += "\n" + subset_markdown_table(summaries, title=subset_title, digits=digits)
    return atomic_write_text(path, text)
