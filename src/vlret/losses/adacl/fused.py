"""The loss's forward pass serving the anchor's clone pass: one matrix product per tile for both.

In training mode :class:`~vlret.losses.AdaCLLoss` (``scale_negatives=False``) needs, from the
same batch, the negatives' log-sum-exps (the loss) and one pass over the score tiles (the
streamed median's band, :class:`~vlret.losses.adacl.anchor.AnchorSearch`). The search is set up
before the loss (its salient scores and GDA need no pass; the first tile sets its band), so the
loss's forward hands each raw tile ``x_I . y^T`` (the product ``TiledAdaCLBatch.scores``
computes, bit for bit) to the search before exponentiating it in place. The backward is the
streaming engine's (``_SquareLSE``), which recomputes its tiles from ``x * scale``; the
forward's exponentials come from the raw tile times ``scale log2(e)`` instead, a difference of
float rounding in the log-sum-exps (tested against float64).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._tiling import Exclusions
from .._tiling.lse import _LOG2E, _SquareLSE, square_lse_forward

Visit = Callable[[int, torch.Tensor], None]


class _VisitedSquareLSE(torch.autograd.Function):
    """``_SquareLSE`` of ``(xs, y)`` with ``xs = x * scale``, its forward tiles computed as
    ``x y^T`` and shown to ``visit(start, tile)`` (read only) before use."""

    @staticmethod
    def forward(ctx, xs, y, x, scale, exclusions, tile, visit):
        factor = scale * _LOG2E

        def product(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
            raw = torch.mm(x[start:stop], y.t(), out=out[: stop - start])
            visit(start, raw)
            return raw.mul_(factor)

        return square_lse_forward(ctx, xs, y, exclusions, tile, product)

    @staticmethod
    def backward(ctx, g_row, g_col):
        dx, dy, _, _ = _SquareLSE.backward(ctx, g_row, g_col)
        return dx, dy, None, None, None, None, None


def visited_square_lse(
    x: torch.Tensor,
    y: torch.Tensor,
    scale: float,
    exclusions: Exclusions,
    tile: int,
    visit: Visit,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column log-sum-exps of the negatives of ``scale * x y^T`` (differentiable in
    ``x`` and ``y``), each raw tile ``x_I y^T`` shown to ``visit(start, tile)`` on the way.

    Args:
        x: ``(B, D)`` rows.
        y: ``(B, D)`` columns.
        scale: The logits' scale (a float: no gradient).
        exclusions: The entries that are not negatives.
        tile: Tile height.
        visit: Called once per tile with its first row and the ``(rows, B)`` scores; must not
            keep or change them.

    Returns:
        ``(row_lse, col_lse)`` as :func:`vlret.losses._tiling.negatives_lse`.
    """
    xs = x if scale == 1.0 else x * scale
    return _VisitedSquareLSE.apply(xs, y, x.detach(), float(scale), exclusions, tile, visit)
