"""What a reader sees on the figures, measured on the drawn matplotlib figures: legends cover
no data and no other legend (their rendered extents against the axes'), the colours of the
series and t-SNE groups can be told apart (CIE76 colour difference computed here from sRGB, and
distinct (colour, marker) pairs), and epoch axes count from 0 as ``metrics.jsonl`` does."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from vlret.analysis._plotting import MARKERS, PALETTE, series_styles  # noqa: E402

#: the least CIE76 difference between two colours used for different series or groups: tab10's
#: closest pair is 27.7, tab20's light and dark pairs (the near-identical colours of before)
#: 16.6
MIN_DELTA_E = 25.0


def lab(color: Any) -> np.ndarray:
    """CIE L*a*b* (D65) of a matplotlib colour, from the sRGB formulas."""
    rgb = np.asarray(to_rgb(color), dtype=np.float64)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = m @ linear / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e(a: Any, b: Any) -> float:
    return float(np.linalg.norm(lab(a) - lab(b)))


@pytest.fixture
def figures(monkeypatch) -> list[Figure]:
    """Every figure saved while the test runs (the Agg ones and pyplot's)."""
    seen: list[Figure] = []
    save = Figure.savefig

    def record(self, *args, **kwargs):
        seen.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return seen


def legend_clashes(fig: Figure) -> list[str]:
    """What is wrong with the figure's legends as drawn: one over an axes (its data region),
    two over each other, one cut by the figure's edge; empty when nothing is."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):  # a pyplot figure, closed once saved
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    boxes = [lg.get_window_extent(renderer) for lg in legends]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    problems = []
    for i, box in enumerate(boxes):
        for ax in axes:
            if box.overlaps(ax.get_window_extent(renderer)):
                problems.append(f"legend {i} over the axes titled {ax.get_title()!r}")
        if not fig.bbox.contains(box.x0, box.y0) or not fig.bbox.contains(box.x1, box.y1):
            problems.append(f"legend {i} outside the figure")
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        if a.overlaps(b):
            problems.append(f"legends {i} and {j} overlap")
    return problems


def legend_labels(fig: Figure) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


# -- the palette --------------------------------------------------------------------------------


def test_the_palette_colours_differ_and_styles_are_distinct_pairs():
    for a, b in itertools.combinations(PALETTE, 2):
        assert delta_e(a, b) > MIN_DELTA_E, (a, b)
    from matplotlib import colormaps

    tab20 = [colormaps["tab20"](i) for i in range(20)]  # the check tells tab20's pairs apart
    assert min(delta_e(a, b) for a, b in itertools.combinations(tab20, 2)) < MIN_DELTA_E
    styles = series_styles(40)
    assert len(set(styles)) == 40
    assert styles[:10] == [(c, "o") for c in PALETTE] and styles[10] == (PALETTE[0], "s")
    assert len(set(series_styles(len(PALETTE) * len(MARKERS)))) == 80


# -- the curves -----------------------------------------------------------------------------------


def write_run(folder: Path, epochs: int, *, warmup: int = 0, person: bool = False) -> Path:
    """A run folder: ``metrics.jsonl`` with epochs 0..epochs-1 (train and dev loss, dev R@1
    per direction, rsum, dev cosines) and ``config.yaml`` (the all-negatives warm-up)."""
    import yaml

    folder.mkdir(parents=True)
    rng = np.random.default_rng(len(folder.name))
    rows = []
    for e in range(epochs):
        row = {"kind": "epoch", "epoch": e, "step": 10 * (e + 1)}
        row.update(train_loss=5.0 / (e + 1) + rng.random(), dev_loss=5.5 / (e + 1))
        row.update(dev_i2t_r1=10.0 + 3 * e, dev_t2i_r1=8.0 + 2 * e, dev_rsum=100.0 + 9 * e)
        row.update(dev_pos_sim=0.3 + 0.02 * e, dev_hardest_neg_sim=0.25 + 0.01 * e)
        rows.append(row)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = {"train": {"epochs": epochs, "all_negatives_epochs": warmup}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return folder


LOSSES = ("adacl", "goal", "infonce", "triplet-hn", "unified", "vsl")


@pytest.fixture
def six_losses(tmp_path) -> dict[str, list[Path]]:
    """A comparison of six losses (two seeds each; three with the all-negatives warm-up), the
    run that drew ten overlapping legend entries over the relative-loss panel."""
    return {
        name: [
            write_run(tmp_path / name / f"seed{s}", 6, warmup=2 if name in LOSSES[1::2] else 0)
            for s in range(2)
        ]
        for name in LOSSES
    }


def test_comparison_figures_keep_legends_off_the_data(tmp_path, figures, six_losses):
    from vlret.analysis.curves import plot_similarity_curves, plot_training_curves
    from vlret.analysis.epoch_curves import plot_r1_curves

    plot_training_curves(six_losses, tmp_path / "plots")
    plot_r1_curves(six_losses, tmp_path / "plots")
    plot_similarity_curves(six_losses, tmp_path / "plots")
    assert len(figures) == 3
    for fig in figures:
        assert legend_clashes(fig) == [], fig.get_suptitle()
        assert all(ax.get_legend() is None for ax in fig.axes)  # one legend per figure
    labels = legend_labels(figures[0])
    # a colour per loss and the line styles' meanings once, not one entry per loss and style
    assert labels[: len(LOSSES)] == list(LOSSES)
    assert labels[len(LOSSES) :] == [
        "training loss (solid)",
        "dev loss (dashed)",
        "all-negatives warm-up ends (goal, triplet-hn, vsl)",
    ]
    assert legend_labels(figures[1]) == list(LOSSES)


def test_curves_count_epochs_from_0(tmp_path, figures, six_losses):
    from vlret.analysis.curves import plot_training_curves
    from vlret.analysis.epoch_curves import plot_run_curves

    run = write_run(tmp_path / "one", 4)
    plot_run_curves([run], tmp_path / "plots")
    plot_training_curves(six_losses, tmp_path / "plots2")
    for fig in figures:
        for ax in fig.axes:
            first = []
            for line in ax.get_lines():
                if line.get_linestyle() == ":":  # the warm-up's end: between epochs 1 and 2
                    assert list(line.get_xdata()) == [1.5, 1.5]
                    continue
                xs = [float(x) for x in line.get_xdata()]  # whole epochs, one after another
                assert xs == [xs[0] + k for k in range(len(xs))], ax.get_title()
                first.append(xs[0])
            assert min(first) == 0.0, ax.get_title()
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
            assert 0.0 in ticks
            assert ax.get_xlabel() == "epoch (from 0)"
    loss = figures[0].axes[0]
    assert {float(x) for line in loss.get_lines() for x in line.get_xdata()} == {0, 1, 2, 3}


def test_run_curves_and_sweeps_keep_legends_off_the_data(tmp_path, figures):
    from vlret.analysis.curves import plot_sweep_curves
    from vlret.analysis.epoch_curves import plot_run_curves

    runs = [write_run(tmp_path / f"run-{i}", 5 + i) for i in range(4)]
    plot_run_curves(runs, tmp_path / "plots")
    points = [
        ({"margin": m, "gamma": g}, 100 + 50 * m + g / 10, 3.0)
        for m in (0.1, 0.2, 0.3)
        for g in (20, 40, 60, 80)
    ]
    plot_sweep_curves(points, ["margin", "gamma"], tmp_path / "plots", loss="unified")
    assert len(figures) == 3
    for fig in figures:
        assert legend_clashes(fig) == []
    assert legend_labels(figures[0]) == [f"run-{i}" for i in range(4)]


def test_goal_and_adacl_figures_keep_legends_off_the_data(tmp_path, figures):
    from vlret.analysis.adacl_plots import append_stats, plot_adacl_margins
    from vlret.analysis.goal_plots import plot_goal_weights

    plot_goal_weights(tmp_path / "goal")
    stats = tmp_path / "stats.jsonl"
    for step in range(1, 40):
        guard = "no_clone" if step % 7 == 0 else None
        append_stats(stats, {"m1": 20.0 + step, "m2": 0.1, "anchor": 0.5, "guard": guard})
    plot_adacl_margins(stats, tmp_path / "adacl")
    assert len(figures) == 3
    for fig in figures:
        assert legend_clashes(fig) == []
    assert len(legend_labels(figures[1])) == 5  # the five pair weights, once for both panels
    assert legend_labels(figures[2]) == ["guard kept margins"]


def test_the_legend_check_sees_a_legend_over_the_data(tmp_path):
    """The detector itself: matplotlib's default in-axes legend is caught."""
    from vlret.analysis._plotting import new_figure

    fig = new_figure((4.0, 3.0))
    ax = fig.subplots()
    for i in range(10):
        ax.plot([0, 1], [i, i + 1], label=f"series {i}")
    ax.legend()
    assert legend_clashes(fig) != []


# -- the t-SNE ------------------------------------------------------------------------------------


def test_tsne_groups_are_told_apart_and_the_legend_is_beside_the_map(tmp_path, figures):
    from vlret.analysis.tsne import GROUP_KIND, TsnePoints, write_tsne

    rng = np.random.default_rng(0)
    groups = [f"shape{g:02d}" for g in range(20)]
    n = 20  # 20 images and their 20 captions, one group each: 40 points, 20 groups
    group = groups[:n]
    points = TsnePoints(
        xy=rng.normal(size=(2 * n, 2)),
        modality=["image"] * n + ["text"] * n,
        image=list(range(n)) * 2,
        caption=[None] * n + list(range(n)),
        group=group + group,
        settings={"split": "dev", "perplexity": 10.0, "groups": GROUP_KIND},
    )
    write_tsne(points, tmp_path / "tsne.png")
    (fig,) = figures
    assert legend_clashes(fig) == []
    ax = fig.axes[0]
    drawn: dict[tuple[str, str], list[Any]] = {}
    for coll in ax.collections:
        if len(coll.get_offsets()) == 0:
            continue
        label = coll.get_label()
        filled = len(coll.get_facecolors()) and coll.get_facecolors()[0][3] > 0
        colour = coll.get_facecolors()[0] if filled else coll.get_edgecolors()[0]
        key = "image" if filled else "text"
        marker = coll.get_paths()[0].vertices.round(3).tobytes()
        drawn.setdefault((key, label if filled else "?"), []).append((tuple(colour), marker))
    images = {label: style[0] for (kind, label), style in drawn.items() if kind == "image"}
    assert sorted(images) == groups  # one filled collection per group
    styles = list(images.values())
    assert len(set(styles)) == len(groups)  # distinct (colour, marker) pairs
    for (ca, ma), (cb, mb) in itertools.combinations(styles, 2):
        # two groups share a marker only with colours told apart
        assert ma != mb or delta_e(ca[:3], cb[:3]) > MIN_DELTA_E
    assert len({s[0] for s in styles}) == len(PALETTE)  # the ten colours, no near twins
    texts = drawn[("text", "?")]  # hollow: the same colours and markers as their images
    assert sorted(texts) == sorted(styles)
    labels = legend_labels(fig)
    assert labels == [*groups, "image (filled)", "text (hollow)"]
