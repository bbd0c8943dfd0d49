"""Comparison figures: series extraction from training logs and valid PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from vlret.analysis.curves import (  # noqa: E402
    adacl_stats_from_log,
    epoch_series,
    plot_adacl_trajectories,
    plot_similarity_curves,
    plot_sweep_curves,
    plot_training_curves,
    read_metrics_log,
    step_epoch_means,
)
from vlret.analysis.goal_plots import plot_goal_heatmap  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def _write_log(run_dir: Path, *, epochs: int = 3, dev_sims: bool = True, adacl: bool = False):
    run_dir.mkdir(parents=True)
    lines = []
    step = 0
    for e in range(epochs):
        for _ in range(2):
            step += 1
            rec = {"kind": "step", "epoch": e, "step": step, "loss": 1.0 / step}
            rec.update({"pos_sim": 0.1 * e, "hardest_neg_sim": 0.05 * e + 0.01 * step})
            if adacl:
                rec.update({"loss_m1": 20.0 + step, "loss_m2": 0.1 * step, "loss_anchor": 0.3})
                rec.update({"loss_step": step, "loss_guard": None, "loss_clone_count": 4})
            lines.append(json.dumps(rec))
        rec = {"kind": "epoch", "epoch": e, "step": step, "train_loss": 2.0 / (e + 1)}
        rec["dev_rsum"] = 100.0 + 10 * e
        if dev_sims:
            rec.update({"dev_pos_sim": 0.2 + 0.1 * e, "dev_hardest_neg_sim": 0.1})
        lines.append(json.dumps(rec))
    lines.append('{"kind": "step", "epo')  # a line cut by a kill
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run_dir


def test_series_extraction(tmp_path):
    records = read_metrics_log(_write_log(tmp_path / "r"))
    assert len(records) == 9
    # epochs from 0, as metrics.jsonl and the console count them
    assert epoch_series(records, "dev_rsum") == {0: 100.0, 1: 110.0, 2: 120.0}
    assert epoch_series(records, "train_loss")[1] == pytest.approx(1.0)
    # steps 3 and 4 are epoch 1: mean of 0.05 + 0.03 and 0.05 + 0.04
    assert step_epoch_means(records, "hardest_neg_sim")[1] == pytest.approx(0.085)
    with pytest.raises(FileNotFoundError):
        read_metrics_log(tmp_path / "missing")


def test_adacl_stats_from_log(tmp_path):
    records = read_metrics_log(_write_log(tmp_path / "r", adacl=True))
    stats = adacl_stats_from_log(records)
    assert [s["step"] for s in stats] == [1, 2, 3, 4, 5, 6]
    assert stats[2]["m1"] == 23.0 and stats[2]["m2"] == pytest.approx(0.3)
    assert "loss" not in stats[0] and stats[0]["clone_count"] == 4


def test_training_and_similarity_plots(tmp_path):
    runs = {
        "triplet": [_write_log(tmp_path / "t0"), _write_log(tmp_path / "t1", epochs=2)],
        "infonce": [_write_log(tmp_path / "i0", dev_sims=False)],  # falls back to train batches
    }
    _assert_png(plot_training_curves(runs, tmp_path / "plots"))
    _assert_png(plot_similarity_curves(runs, tmp_path / "plots"))


def test_sweep_plots_one_file_per_parameter(tmp_path):
    points = [
        ({"margin": m, "gamma": g}, 400 + 100 * m + g / 10, 1.0)
        for m in (0.0, 0.1, 0.2)
        for g in (20, 60)
    ]
    paths = plot_sweep_curves(points, ["margin", "gamma"], tmp_path, loss="unified")
    assert [p.name for p in paths] == ["sweep_margin.png", "sweep_gamma.png"]
    for p in paths:
        _assert_png(p)


def test_adacl_and_goal_heatmap(tmp_path):
    runs = {"adacl": [_write_log(tmp_path / "a0", adacl=True)]}
    (path,) = plot_adacl_trajectories(runs, tmp_path / "plots")
    assert path.name == "adacl_margins_adacl.png"
    _assert_png(path)
    assert (tmp_path / "plots" / "adacl_margins_adacl.jsonl").is_file()
    assert plot_adacl_trajectories({"x": [_write_log(tmp_path / "x0")]}, tmp_path / "p2") == []

    cells = {
        (t, p): {"i2t_r1": float(i), "t2i_r1": float(j), "rsum": float(i + j)}
        for i, t in enumerate(("con", "nca", "cir"))
        for j, p in enumerate(("con", "lin", "sig", "lin-ms", "sig-ms"))
        if (t, p) != ("nca", "sig")  # a missing combination is left blank
    }
    _assert_png(
        plot_goal_heatmap(
            cells,
            tmp_path / "plots",
            triplet_weights=("con", "nca", "cir"),
            pair_weights=("con", "lin", "sig", "lin-ms", "sig-ms"),
        )
    )


def test_epoch_curve_markdown_means_and_stds(tmp_path):
    from vlret.analysis.curves import CURVES_TABLE, epoch_curve_markdown, write_epoch_curves

    def log(d, values):
        d.mkdir(parents=True)
        lines = [{"kind": "step", "epoch": 0, "dev_rsum": 999.0}]  # step records are ignored
        lines += [{"kind": "epoch", "epoch": e, "dev_rsum": v} for e, v in enumerate(values)]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
        return d

    runs = {
        "a": [log(tmp_path / "a0", [10.0, 20.0]), log(tmp_path / "a1", [12.0])],
        "b": [log(tmp_path / "b0", [5.0, 7.0])],
    }
    text = epoch_curve_markdown(runs, "dev_rsum", title="Dev rsum")
    lines = text.splitlines()
    assert lines[:2] == ["### Dev rsum", ""]
    assert lines[2] == "| Loss | ep 0 | ep 1 |"  # from 0, as metrics.jsonl counts
    # seeds 10 and 12: mean 11, sample std sqrt(2); epoch 1 only one seed
    assert lines[4] == f"| a | 11.0 ± {2**0.5:.1f} | 20.0 |"
    assert lines[5] == "| b | 5.0 | 7.0 |"
    path = write_epoch_curves(runs, tmp_path / "out")
    assert path.name == CURVES_TABLE and "| a | 11.0 ± 1.4 | 20.0 |" in path.read_text()
    assert "cosine" not in path.read_text()  # keys no run logged get no table


def _warmup_run(run_dir: Path, losses: list[float], *, all_negatives_epochs: int) -> Path:
    """A run log whose loss changes definition after ``all_negatives_epochs`` (the
    VSE-infinity warm-up: the all-negatives hinge sum is far larger than the hardest one)."""
    import yaml

    run_dir.mkdir(parents=True)
    lines = [
        {"kind": "epoch", "epoch": e, "step": e + 1, "train_loss": v, "dev_rsum": 10.0 * e}
        for e, v in enumerate(losses)
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    config = {"train": {"epochs": len(losses), "all_negatives_epochs": all_negatives_epochs}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return run_dir


def test_loss_plot_normalises_each_loss_definition_separately(tmp_path, monkeypatch):
    # Triplet-HN, GOAL and VSL sum the hinge over all negatives for the warm-up epochs, then
    # take the hardest: divided by the first (warm-up) epoch's loss, the hardest-negative phase
    # showed as ~0 (4 / 100). Each definition is divided by its own first epoch instead, and
    # the switch is marked.
    from vlret.analysis import curves

    figures = []
    monkeypatch.setattr(curves, "save_figure", lambda fig, path: figures.append(fig) or path)
    runs = {
        "triplet-hn": [
            _warmup_run(tmp_path / "t0", [100.0, 80.0, 4.0, 3.0, 2.0], all_negatives_epochs=2),
            _warmup_run(tmp_path / "t1", [120.0, 60.0, 8.0, 4.0, 6.0], all_negatives_epochs=2),
        ],
        "infonce": [
            _warmup_run(tmp_path / "i0", [10.0, 5.0, 4.0, 3.0, 2.0], all_negatives_epochs=0)
        ],
    }
    curves.plot_training_curves(runs, tmp_path / "plots")
    ax_loss, ax_rsum = figures[0].axes[:2]
    points: dict[str, dict[float, float]] = {}
    switches = []
    for line in ax_loss.get_lines():
        xs, ys = list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))
        if len(set(xs)) == 1 and len(xs) == 2 and line.get_linestyle() == ":":
            switches.append(xs[0])  # a vertical marker
            continue
        color = line.get_color()
        points.setdefault(color, {}).update(zip(xs, ys, strict=True))
    assert switches == [1.5]  # after epoch 1 (the second, epochs from 0), before epoch 2
    by_first = {round(p[0.0], 6): p for p in points.values()}
    assert set(by_first) == {1.0}  # every series starts at 1, at epoch 0
    triplet = next(p for p in points.values() if 2.0 in p and p[1.0] == pytest.approx(0.65))
    # warm-up: mean over the seeds of (80 / 100, 60 / 120); hardest phase: / epoch 2 of its seed
    assert [triplet[e] for e in (2.0, 3.0, 4.0)] == pytest.approx([1.0, 0.625, 0.625])
    assert min(triplet.values()) > 0.5  # not the 0.03 of dividing by the warm-up's first epoch
    infonce = next(p for p in points.values() if p[1.0] == pytest.approx(0.5))
    assert [infonce[e] for e in (2.0, 3.0, 4.0)] == pytest.approx([0.4, 0.3, 0.2])
    assert any(line.get_linestyle() == ":" for line in ax_rsum.get_lines())  # marked there too


def test_relative_loss_segments_and_definition_starts(tmp_path):
    from vlret.analysis.curves import loss_definition_starts, relative_loss_segments

    series = {0: 50.0, 1: 40.0, 2: 2.0, 3: 1.0}
    assert relative_loss_segments(series, (0, 2)) == [{0: 1.0, 1: 0.8}, {2: 1.0, 3: 0.5}]
    assert relative_loss_segments(series) == [{e: v / 50.0 for e, v in series.items()}]
    # a run stopped during the warm-up has no second segment; a zero first value is skipped
    assert relative_loss_segments({0: 5.0}, (0, 2)) == [{0: 1.0}, {}]
    assert relative_loss_segments({0: 0.0, 1: 1.0}) == [{}]
    run = _warmup_run(tmp_path / "r", [1.0], all_negatives_epochs=5)
    assert loss_definition_starts(run) == (0, 5)  # epochs 0-4 warm up, epoch 5 is the next
    assert loss_definition_starts(tmp_path / "no-config") == (0,)


# -- dev loss and dev R@1 per direction (Unified Fig. 3a, AdaCL Fig. 7) -----------------------


def _dev_run(run_dir: Path, rows: list[dict], *, config: dict | None = None) -> Path:
    """A run whose epoch records hold ``rows`` (train_loss, dev_loss, R@1 keys, ...)."""
    run_dir.mkdir(parents=True)
    lines = [
        json.dumps({"kind": "epoch", "epoch": e, "step": e + 1, **row})
        for e, row in enumerate(rows)
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if config is not None:
        import yaml

        (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return run_dir


def _rows(train, dev, i2t, t2i, *, upper: bool = False):
    """Epoch rows; ``upper``: a person-search log as earlier releases wrote it (``dev_t2i_R1``,
    the identity level, beside the image-level ``dev_t2i_r1``)."""
    k = "R1" if upper else "r1"
    extra = {"dev_i2t_r1": -1.0, "dev_t2i_r1": -1.0} if upper else {}  # image-level, unused
    return [
        {
            "train_loss": a,
            "dev_loss": b,
            f"dev_i2t_{k}": c,
            f"dev_t2i_{k}": d,
            "dev_rsum": c + d,
            **extra,
        }
        for a, b, c, d in zip(train, dev, i2t, t2i, strict=True)
    ]


def test_r1_keys_are_the_image_level_ones_or_person_searchs_identity_level():
    from vlret.analysis.epoch_curves import r1_keys

    assert r1_keys(_rows([1.0], [1.0], [2.0], [3.0])) == ("dev_i2t_r1", "dev_t2i_r1")
    from vlret.metrics import normalise_metric_record

    # an older person-search log (dev_t2i_R1) as read_metrics_log reads it
    old = [{"kind": "epoch", **r} for r in _rows([1.0], [1.0], [2.0], [3.0], upper=True)]
    person = [normalise_metric_record(r) for r in old]
    assert r1_keys(person) == ("dev_identity_i2t_r1", "dev_identity_t2i_r1")
    assert [person[0][k] for k in r1_keys(person)] == [2.0, 3.0]
    # a real epoch record's keys: the trainer logs the image-level recalls with a dev_ prefix
    from vlret.train.run_log import epoch_record

    class Trainer:
        select_on, step, best_metric, best_epoch = "rsum", 3, 1.0, 0
        optimizer = type("O", (), {"param_groups": [{"lr": 0.1}]})()
        dev_set = None  # features: nothing skipped

    dev = {"i2t_r1": 10.0, "t2i_r1": 20.0, "rsum": 30.0}
    record = epoch_record(
        Trainer(), 0, train_loss=2.0, dev_loss=1.5, seconds=1.0, dev=dev, skipped=None
    )
    assert list(record)[3:5] == ["train_loss", "dev_loss"] and record["dev_loss"] == 1.5
    assert [record[k] for k in r1_keys([record])] == [10.0, 20.0]


def test_curves_md_tabulates_dev_loss_and_r1_per_direction(tmp_path):
    from vlret.analysis.curves import write_epoch_curves

    runs = {
        "a": [
            _dev_run(tmp_path / "a0", _rows([3.0, 2.0], [2.5, 2.25], [10.0, 20.0], [5.0, 15.0])),
            _dev_run(tmp_path / "a1", _rows([3.0, 2.0], [2.0, 1.75], [12.0, 30.0], [7.0, 25.0])),
        ]
    }
    text = write_epoch_curves(runs, tmp_path).read_text()
    tables = {part.splitlines()[0]: part for part in text.split("### ")[1:]}
    loss = tables["Dev loss (the training loss on the dev split)"]
    # mean ± sample std over the two seeds: (2.5, 2.0) -> 2.250 ± 0.354; (2.25, 1.75)
    assert "| a | 2.250 ± 0.354 | 2.000 ± 0.354 |" in loss
    assert "| a | 11.0 ± 1.4 | 25.0 ± 7.1 |" in tables["Dev I->T R@1"]
    assert "| a | 6.0 ± 1.4 | 20.0 ± 7.1 |" in tables["Dev T->I R@1"]


def _lines(ax) -> list[tuple[str, str, dict[float, float]]]:
    """``(colour, style, {x: y})`` of an axis's data lines."""
    out = []
    for line in ax.get_lines():
        xs, ys = list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))
        out.append((line.get_color(), line.get_linestyle(), dict(zip(xs, ys, strict=True))))
    return out


def test_loss_plot_draws_the_dev_loss_by_the_training_losss_first_epoch(tmp_path, monkeypatch):
    from vlret.analysis import curves

    figures = []
    monkeypatch.setattr(curves, "save_figure", lambda fig, path: figures.append(fig) or path)
    run = _dev_run(tmp_path / "r", _rows([4.0, 2.0, 1.0], [3.0, 2.5, 2.0], [1, 2, 3], [1, 2, 3]))
    curves.plot_training_curves({"triplet": [run]}, tmp_path)
    ax_loss = figures[0].axes[0]
    (train,) = [p for _, s, p in _lines(ax_loss) if s == "-"]
    (dev,) = [p for _, s, p in _lines(ax_loss) if s == "--"]
    assert train == {0.0: 1.0, 1.0: 0.5, 2.0: 0.25}
    assert dev == {0.0: 0.75, 1.0: 0.625, 2.0: 0.5}  # / 4.0, the first training loss
    labels = ax_loss.get_legend_handles_labels()[1]
    assert labels == ["triplet", "triplet (dev)"]


def test_r1_plot_draws_each_direction_from_its_key(tmp_path, monkeypatch):
    from vlret.analysis import epoch_curves

    figures = []
    monkeypatch.setattr(epoch_curves, "save_figure", lambda fig, path: figures.append(fig) or path)
    image = _dev_run(tmp_path / "img", _rows([1.0, 1.0], [1.0, 1.0], [10.0, 20.0], [30.0, 40.0]))
    person = _dev_run(
        tmp_path / "pers", _rows([1.0, 1.0], [1.0, 1.0], [50.0, 60.0], [70.0, 80.0], upper=True)
    )
    epoch_curves.plot_r1_curves({"clip": [image], "irra": [person]}, tmp_path)
    ax_i2t, ax_t2i = figures[0].axes[:2]
    assert [p for _, _, p in _lines(ax_i2t)] == [{0.0: 10.0, 1.0: 20.0}, {0.0: 50.0, 1.0: 60.0}]
    assert [p for _, _, p in _lines(ax_t2i)] == [{0.0: 30.0, 1.0: 40.0}, {0.0: 70.0, 1.0: 80.0}]
    assert ax_i2t.get_title() == "dev I->T R@1" and ax_t2i.get_title() == "dev T->I R@1"


def test_vlret_plot_curves_writes_the_figure_and_tables(tmp_path, capsys):
    from vlret.cli import main

    a = _dev_run(tmp_path / "runs" / "a", _rows([3.0, 2.0], [2.5, 2.0], [10.0, 20.0], [5.0, 15.0]))
    b = _dev_run(tmp_path / "other" / "a", _rows([3.0], [2.0], [12.0], [7.0]))
    out = tmp_path / "out"
    assert main(["plot", "curves", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "training_curves.png"), str(out / "curves.md")]
    _assert_png(out / "training_curves.png")
    table = (out / "curves.md").read_text()
    assert f"| {a} | 2.500 | 2.000 |" in table and f"| {b} | 2.000 | - |" in table  # same name
    assert main(["plot", "curves", str(a)]) == 0  # one run: its plots/ folder
    assert capsys.readouterr().out.split()[0] == str(a / "plots" / "training_curves.png")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["curves"], "curves needs at least one RUN folder (holding metrics.jsonl)"),
        (["curves", "{a}", "{a}/../a", "--out", "{o}"], "the same run folder is given twice"),
        (["curves", "{missing}", "--out", "{o}"], "training log not found: {missing}"),
        (["curves", "{empty}", "--out", "{o}"], "no epoch record yet"),
        (["curves", "{a}", "{empty}"], "curves of several runs needs --out DIR"),
        (["goal-weights", "{a}", "--out", "{o}"], "goal-weights takes no RUN"),
        (["goal-weights"], "goal-weights needs --out DIR"),
    ],
)
def test_vlret_plot_curves_errors_are_one_line(tmp_path, capsys, argv, message):
    from vlret.cli import main

    a = _dev_run(tmp_path / "a", _rows([3.0], [2.0], [1.0], [1.0]))
    empty = _dev_run(tmp_path / "empty", [])
    names = {"a": a, "o": tmp_path / "o", "missing": tmp_path / "missing", "empty": empty}
    assert main(["plot", *[x.format(**names) for x in argv]]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vlret plot: ")
    assert message.format(**names) in lines[0]
