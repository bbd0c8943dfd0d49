"""GOAL weight figures: triplet-weight diagrams (paper Fig. 2) and pair-weight curves (Fig. 3).

``vlret plot goal-weights --out DIR`` calls :func:`plot_goal_weights`. matplotlib is an optional
extra (``pip install vlret[plot]``); it is imported inside the function with the Agg backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ..losses.goal import goal_pair_weights, goal_triplet_weight
from ._plotting import legend_outside, new_figure, save_figure

#: Settings of the figures: Fig. 2 uses m = 0.2 and tau = 10; Fig. 3 alpha = 2, beta = 10,
#: lambda = 0.5 and relative terms m = 0.1 for the MS weights. circle_offset: our default.
MARGIN, TAU, CIRCLE_OFFSET = 0.2, 10.0, 0.5
ALPHA, BETA, LAM, MS_TERM = 2.0, 10.0, 0.5, 0.1

#: The files of :func:`plot_goal_weights` (Fig. 2, Fig. 3), in its ``out_dir``.
GOAL_WEIGHT_FIGURES = ("goal_triplet_weights.png", "goal_pair_weights.png")
TRIPLET_PANELS = (
    ("con", r"$T^{con}$, $m=0.2$"),
    ("nca", r"$T^{nca}$, $\tau=10$"),
    ("cir", r"$T^{cir}$, $\tau=10$, offset 0.5"),
)
PAIR_CURVES = (
    ("con", r"$P^{con}$"),
    ("lin", r"$P^{lin}$"),
    ("sig", r"$P^{sig}$"),
    ("lin-ms", r"$P^{\mathrm{lin-ms}}$, $m^{lin}=0.1$"),
    ("sig-ms", r"$P^{\mathrm{sig-ms}}$, $m^{sig}=0.1$"),
)


def triplet_weight_grid(
    kind: str, size: int = 201
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A triplet weight of GOAL Table 1 on a grid of similarities (Fig. 2).

    Args:
        kind: ``"con"``, ``"nca"`` or ``"cir"``.
        size: Points per axis of the ``[-1, 1]^2`` grid.

    Returns:
        ``(pos, neg, T)``, each ``(size, size)``: pos along x, neg along y.
    """
    axis = torch.linspace(-1.0, 1.0, size, dtype=torch.float64)
    neg, pos = torch.meshgrid(axis, axis, indexing="ij")
    weight = goal_triplet_weight(
        kind, pos, neg, margin=MARGIN, tau=TAU, circle_offset=CIRCLE_OFFSET
    )
    return pos, neg, weight


def pair_weight_curves(
    kind: str, size: int = 201
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pair weight of GOAL Table 1 over ``[-1, 1]`` (Fig. 3).

    Args:
        kind: ``"con"``, ``"lin"``, ``"sig"``, ``"lin-ms"`` or ``"sig-ms"`` (MS weights with
            relative terms ``m = 0.1``).
        size: Points on the similarity axis.

    Returns:
        ``(similarity, P+, P-)``: P+ as a function of the positive similarity, P- of the
        negative one.
    """
    sim = torch.linspace(-1.0, 1.0, size, dtype=torch.float64)
    ms = MS_TERM if kind in ("lin-ms", "sig-ms") else None
    p_pos, p_neg = goal_pair_weights(
        kind, sim, sim, alpha=ALPHA, beta=BETA, lam=LAM, ms_pos=ms, ms_neg=ms
    )
    return sim, p_pos, p_neg


def plot_goal_weights(out_dir: Path) -> list[Path]:
    """Draw GOAL's Fig. 2 and Fig. 3.

    Args:
        out_dir: The folder (created if needed).

    Returns:
        The paths of ``goal_triplet_weights.png`` and ``goal_pair_weights.png``.

    Raises:
        MissingExtra: matplotlib is not installed (``pip install vlret[plot]``).
    """
    from ._plotting import require_matplotlib

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.2), constrained_layout=True)
    for ax, (kind, title) in zip(axes, TRIPLET_PANELS, strict=True):
        pos, neg, weight = triplet_weight_grid(kind)
        mesh = ax.pcolormesh(
            pos.numpy(), neg.numpy(), weight.numpy(), vmin=0, vmax=1, cmap="viridis", shading="auto"
        )
        if kind != "con":
            ax.contour(
                pos.numpy(),
                neg.numpy(),
                weight.numpy(),
                levels=[0.1, 0.5, 0.9],
                colors="white",
                linewidths=0.8,
            )
        ax.set_title(title)
        ax.set_xlabel("positive similarity $S_{x,y}$")
        ax.set_ylabel("negative similarity $S_{x,y'}$")
        ax.set_aspect("equal")
    fig.colorbar(mesh, ax=axes, shrink=0.85, label="triplet weight T")
    fig.suptitle("GOAL triplet weights (Fig. 2)")
    path = save_figure(fig, out_dir / GOAL_WEIGHT_FIGURES[0])
    plt.close(fig)
    paths.append(path)

    fig, (ax_pos, ax_neg) = plt.subplots(1, 2, figsize=(11, 4.7), constrained_layout=True)
    for kind, label in PAIR_CURVES:
        sim, p_pos, p_neg = pair_weight_curves(kind)
        ax_pos.plot(sim.numpy(), p_pos.numpy(), label=label)
        ax_neg.plot(sim.numpy(), p_neg.numpy(), label=label)
    ax_pos.set_title("positive pair weight $P_+$")
    ax_pos.set_xlabel("positive similarity $S_{x,y}$")
    ax_neg.set_title("negative pair weight $P_-$")
    ax_neg.set_xlabel("negative similarity $S_{x,y'}$")
    for ax in (ax_pos, ax_neg):
        ax.set_ylabel("weight")
        ax.grid(alpha=0.3)
    # one legend for both panels (the same five curves), under them: it covers no curve
    legend_outside(fig, *ax_pos.get_legend_handles_labels())
    fig.suptitle(r"GOAL pair weights (Fig. 3): $\alpha=2$, $\beta=10$, $\lambda=0.5$")
    path = save_figure(fig, out_dir / GOAL_WEIGHT_FIGURES[1])
    plt.close(fig)
    paths.append(path)
    return paths


#: The file name of :func:`plot_goal_heatmap`'s figure.
GOAL_HEATMAP_FIGURE = "goal_grid_heatmap.png"


def plot_goal_heatmap(
    cells: Mapping[tuple[str, str], Mapping[str, float]],
    out_dir: str | Path,
    *,
    triplet_weights: Sequence[str],
    pair_weights: Sequence[str],
) -> Path:
    """Draw the GOAL grid (GOAL paper Tables 3-5) as three heatmaps: I->T R@1, T->I R@1 and
    rsum; rows are triplet weights, columns pair weights, the best cell in bold.

    Args:
        cells: ``(triplet_weight, pair_weight)`` -> the mean metrics of that combination
            (``i2t_r1``, ``t2i_r1``, ``rsum``); a missing combination or metric is left blank.
        out_dir: The folder of the figure.
        triplet_weights: The row order.
        pair_weights: The column order.

    Returns:
        The path of ``goal_grid_heatmap.png``.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import numpy as np

    keys = (("i2t_r1", "I→T R@1"), ("t2i_r1", "T→I R@1"), ("rsum", "rsum"))
    fig = new_figure((4.4 * len(keys) + 0.6, 3.4))
    axes = fig.subplots(1, len(keys))
    for ax, (key, title) in zip(axes, keys, strict=True):
        grid = np.full((len(triplet_weights), len(pair_weights)), np.nan)
        for i, t in enumerate(triplet_weights):
            for j, p in enumerate(pair_weights):
                value = cells.get((t, p), {}).get(key)
                if value is not None:
                    grid[i, j] = value
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto")
        finite = grid[np.isfinite(grid)]
        best = finite.max() if finite.size else None
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if np.isfinite(grid[i, j]):
                    ax.text(
                        j,
                        i,
                        f"{grid[i, j]:.1f}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        fontweight="bold" if grid[i, j] == best else "normal",
                        color="white" if grid[i, j] < np.nanmean(grid) else "black",
                    )
        ax.set_xticks(range(len(pair_weights)), [f"$P^{{{p}}}$" for p in pair_weights])
        ax.set_yticks(range(len(triplet_weights)), [f"$T^{{{t}}}$" for t in triplet_weights])
        ax.set_title(title)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle("GOAL gradient combinations (cf. GOAL Tables 3-5)")
    fig.tight_layout()
    return save_figure(fig, Path(out_dir) / GOAL_HEATMAP_FIGURE)
