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

from .._tiling import Exclusions, tiles
from .._tiling.lse import _LN2, _LOG2E, _careful_tile, _fast_floor, _norm_shift, _SquareLSE

Visit = Callable[[int, torch.Tensor], None]


class _VisitedSquareLSE(torch.autograd.Function):
    """``_SquareLSE`` of ``(xs, y)`` with ``xs = x * scale``, its forward tiles computed as
    ``x y^T`` and shown to ``visit(start, tile)`` (read only) before use."""

    @staticmethod
    def forward(ctx, xs, y, x, scale, exclusions, tile, visit):
        batch = xs.shape[0]
        lowest = torch.finfo(xs.dtype).min
        floor = _fast_floor(xs.dtype)
        fixed = _norm_shift(xs, y, floor)
        factor = scale * _LOG2E
        row_lse, col_lse = xs.new_empty(batch), xs.new_full((batch,), lowest)
        shifts: list[float | None] = []
        buf = xs.new_empty(min(tile, batch), batch)  # one tile, reused
        for start, stop in tiles(batch, tile):
            s = torch.mm(x[start:stop], y.t(), out=buf[: stop - start])
            visit(start, s)
            e = s.mul_(factor)
            shift = e.max() if fixed is None else fixed
            e = exclusions.fill_(e.sub_(shift).exp2_(), start, 0.0)
            log_rows, log_cols = e.sum(1).log_(), e.sum(0).log_()
            if bool(torch.minimum(log_rows.min(), log_cols.min()) >= floor):
                row_lse[start:stop] = log_rows.add_(shift * _LN2)
                col_lse = torch.logaddexp(col_lse, log_cols.add_(shift * _LN2))
                shifts.append(float(shift))
                if stop - start == batch:  # a single tile: the backward reuses it
                    ctx.kept = e
                continue
            del e, log_rows, log_cols
            row_lse[start:stop], cols = _careful_tile(xs, y, exclusions, start, stop)
            col_lse = torch.logaddexp(col_lse, cols)
            shifts.append(None)
        ctx.tile, ctx.shifts, ctx.exclusions = tile, shifts, exclusions
        ctx.save_for_backward(xs, y, row_lse, col_lse)
        return row_lse, col_lse

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
