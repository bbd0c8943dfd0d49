"""Paper-style tables: mean +- std, bold on the best, CSV and JSON contents."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from vlret.analysis.tables import (
    METRIC_KEYS,
    RunResult,
    best_labels,
    goal_grid_markdown,
    markdown_table,
    mean_std,
    summarize,
    write_results_csv,
    write_results_json,
)


def _metrics(base: float) -> dict[str, float]:
    m = {k: base + i for i, k in enumerate(METRIC_KEYS)}
    m["rsum"] = sum(m[k] for k in METRIC_KEYS[:6])
    return m


def _runs() -> list[RunResult]:
    return [
        RunResult("triplet", "triplet", 0, _metrics(10.0)),
        RunResult("unified", "unified", 0, _metrics(20.0), params={"gamma": 60.0}),
        RunResult("triplet", "triplet", 1, _metrics(14.0)),
        RunResult("unified", "unified", 1, _metrics(21.0), params={"gamma": 60.0}),
        RunResult("triplet", "triplet", 2, _metrics(12.5)),
        RunResult("unified", "unified", 2, _metrics(19.0), params={"gamma": 60.0}),
    ]


def test_mean_std_matches_statistics():
    values = [10.0, 14.0, 12.5]
    mean, std = mean_std(values)
    assert mean == pytest.approx(statistics.mean(values))
    assert std == pytest.approx(statistics.stdev(values))
    assert mean_std([3.0]) == (3.0, 0.0)
    with pytest.raises(ValueError):
        mean_std([])


def test_summarize_groups_in_order_and_sorts_seeds():
    summaries = summarize(reversed(_runs()))
    assert [s.label for s in summaries] == ["unified", "triplet"]
    tri = summaries[1]
    assert tri.seeds == [0, 1, 2]
    values = [10.0, 14.0, 12.5]
    assert tri.mean["i2t_r1"] == pytest.approx(statistics.mean(values))
    assert tri.std["i2t_r1"] == pytest.approx(statistics.stdev(values))
    assert summaries[0].params == {"gamma": 60.0}


def test_markdown_table_cells_and_bold_on_best():
    summaries = summarize(_runs())
    text = markdown_table(summaries, title="demo")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header, tri, uni = rows[0], rows[1], rows[2]
    assert "I→T R@1" in header and "T→I R@10" in header and "rsum" in header
    # unified is better everywhere: every one of its 7 cells bold, none of triplet's
    assert tri.count("**") == 0
    assert uni.count("**") == 14
    m, s = mean_std([20.0, 21.0, 19.0])
    assert f"**{m:.1f} ± {s:.1f}**" in uni
    m, s = mean_std([10.0, 14.0, 12.5])
    assert f"| triplet | {m:.1f} ± {s:.1f} |" in tri
    assert "over 3 seeds" in text


def test_bold_ties_and_single_seed_cells():
    a = RunResult("a", "triplet", 0, {**_metrics(10.0), "i2t_r1": 50.04})
    b = RunResult("b", "infonce", 0, {**_metrics(10.0), "i2t_r1": 49.96, "rsum": 1.0})
    text = markdown_table(summarize([a, b]))
    row_a, row_b = [
        line for line in text.splitlines() if line.startswith("| a") or line.startswith("| b")
    ]
    # both show 50.0 -> both bold; a single seed shows no "±"
    assert row_a.split("|")[2].strip() == "**50.0**"
    assert row_b.split("|")[2].strip() == "**50.0**"
    assert "±" not in row_a
    assert row_b.split("|")[8].strip() == "1.0"  # rsum of b is worse: not bold
    assert "one seed" in text


def test_best_labels_lower_is_better_for_ranks():
    summaries = summarize(_runs())
    assert best_labels(summaries, "rsum") == {"unified"}
    assert best_labels(summaries, "i2t_medr") == {"triplet"}


def test_csv_and_json_hold_runs_mean_and_std(tmp_path):
    summaries = summarize(_runs())
    path = write_results_csv(summaries, tmp_path / "results.csv")
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert len(rows) == 2 * (3 + 2)
    tri = [r for r in rows if r["label"] == "triplet"]
    assert [r["seed"] for r in tri] == ["0", "1", "2", "mean", "std"]
    assert float(tri[1]["i2t_r1"]) == 14.0
    assert float(tri[3]["i2t_r1"]) == pytest.approx(statistics.mean([10.0, 14.0, 12.5]))
    assert float(tri[4]["i2t_r1"]) == pytest.approx(statistics.stdev([10.0, 14.0, 12.5]))
    assert json.loads(rows[5]["params"]) == {"gamma": 60.0}

    jpath = write_results_json(summaries, tmp_path / "results.json", protocol="f30k")
    doc = json.loads(jpath.read_text(encoding="utf-8"))
    assert doc["protocol"] == "f30k"
    uni = doc["variants"][1]
    assert uni["label"] == "unified" and uni["seeds"] == [0, 1, 2]
    assert [r["metrics"]["i2t_r1"] for r in uni["runs"]] == [20.0, 21.0, 19.0]
    assert uni["std"]["i2t_r1"] == pytest.approx(1.0)


def test_goal_grid_markdown_layout():
    runs = [
        RunResult(
            f"goal-{t}-{p}",
            "goal",
            0,
            {**_metrics(1.0), "i2t_r1": float(i), "t2i_r1": float(10 - i), "rsum": float(i)},
            params={"triplet_weight": t, "pair_weight": p},
        )
        for i, (t, p) in enumerate([("con", "con"), ("cir", "sig-ms")])
    ]
    text = goal_grid_markdown(
        summarize(runs), triplet_weights=("con", "cir"), pair_weights=("con", "sig-ms")
    )
    lines = text.splitlines()
    assert lines[2] == "| T \\ P | con | sig-ms |"
    assert lines[4] == "| con | 0.0 / **10.0** (0.0) | - |"
    assert lines[5] == "| cir | - | **1.0** / 9.0 (**1.0**) |"
