"""GOAL weight figures (Fig. 2 and 3): the plotted data and the PNG files."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.analysis.goal_plots import pair_weight_curves, triplet_weight_grid


def test_triplet_grids_have_the_papers_contours():
    pos, neg, t = triplet_weight_grid("nca", size=101)
    on_diagonal = (pos - neg).abs() < 1e-12
    torch.testing.assert_close(t[on_diagonal], torch.full_like(t[on_diagonal], 0.5))
    pos, neg, t = triplet_weight_grid("cir", size=101)
    # T^cir = 1/2 on the circle (1 - p)^2 + s_n^2 = 1 - offset = 1/2 around (1, 0).
    radius2 = (1 - pos) ** 2 + neg**2
    assert (t[radius2 < 0.5 - 0.05] < 0.5).all() and (t[radius2 > 0.5 + 0.05] > 0.5).all()
    pos, neg, t = triplet_weight_grid("con", size=101)
    assert set(t.unique().tolist()) == {0.0, 1.0}
    assert bool(((t == 1) == (0.2 + neg - pos > 0)).all())


def test_pair_curves():
    sim, p_pos, p_neg = pair_weight_curves("sig")
    mid = sim.abs().argmin()  # no grid point at lambda; check the formula on the curve
    assert math.isclose(float(p_pos[mid]), 1 / (1 + math.exp(2 * (0.0 - 0.5))), rel_tol=1e-12)
    sim, p_pos, p_neg = pair_weight_curves("sig-ms")
    assert float(p_neg.max()) > 1 and float(p_neg.max()) < 10  # bounded by 1/m = 10
    sim, p_pos, p_neg = pair_weight_curves("lin-ms")
    torch.testing.assert_close(p_pos, 0.9 * (1 - sim))
    torch.testing.assert_close(p_neg, 1.1 * sim.clamp(min=0))


def test_plot_goal_weights_writes_pngs_and_cli_prints_them(tmp_path, capsys):
    """`vlret plot goal-weights --out DIR` runs plot_goal_weights(DIR): two non-blank PNGs."""
    mpimg = pytest.importorskip("matplotlib.image")
    from vlret.cli import main

    out = tmp_path / "figs"
    assert main(["plot", "goal-weights", "--out", str(out)]) == 0
    paths = [out / "goal_triplet_weights.png", out / "goal_pair_weights.png"]
    assert capsys.readouterr().out.split() == [str(p) for p in paths]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.shape[0] > 300 and img.shape[1] > 800 and float(img.std()) > 0.05
