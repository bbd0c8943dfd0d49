"""Hardest negatives (value, index) and sums of hinges over the negatives, streamed."""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import torch
from torch.autograd.function import once_differentiable

from .tiles import Exclusions, masked_tiles


@torch.no_grad()
def hardest_negatives(
    x: torch.Tensor,
    y: torch.Tensor,
    exclusions: Exclusions,
    tile: int,
    *,
    columns: bool,
    visit: Callable[[int, int, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, ...]:
    """The largest negative score of every row (and, ``columns``, every column) and its index.

    Args:
        x: ``(n, D)`` rows.
        y: ``(C, D)`` candidates.
        exclusions: The entries that are not negatives.
        tile: Tile height.
        columns: Square mode: also every column's largest negative over all rows.
        visit: Called as ``visit(start, stop, t)`` on every masked tile (excluded entries hold
            the dtype's most negative value), for statistics gathered in the same pass.

    Returns:
        ``(row_value, row_index)``, then ``(col_value, col_index)`` with ``columns``. A line
        without negatives has the dtype's most negative finite value. Ties: the lowest index.
    """
    lowest = torch.finfo(x.dtype).min
    n, width = x.shape[0], y.shape[0]
    row_max, row_arg = x.new_empty(n), torch.zeros(n, dtype=torch.long, device=x.device)
    if columns:
        col_max = x.new_full((width,), lowest)
        col_arg = torch.zeros(width, dtype=torch.long, device=x.device)
    for start, stop, t in masked_tiles(x, y, exclusions, tile, lowest):
        # torch.max returns the first maximal index; strict ">" keeps the earlier tile's.
        row_max[start:stop], row_arg[start:stop] = t.max(dim=1)
        if columns:
            values, index = t.max(dim=0)
            better = values > col_max
            col_max = torch.where(better, values, col_max)
            col_arg = torch.where(better, index + start, col_arg)
        if visit is not None:
            visit(start, stop, t)
    return (row_max, row_arg, col_max, col_arg) if columns else (row_max, row_arg)


class _HingeSums(torch.autograd.Function):
    """``sum_j [margin + s_ij - d_i]_+`` over row ``i``'s negatives (and over column ``j``'s:
    ``sum_i [margin + s_ij - d_j]_+`` when ``d_col`` is given). The backward recomputes the
    tiles; a hinge at exactly zero passes its gradient, as the dense ``clamp`` does."""

    @staticmethod
    def forward(ctx, x, y, d_row, d_col, margin, exclusions, tile):
        lowest = torch.finfo(x.dtype).min
        row = x.new_empty(x.shape[0])
        col = None if d_col is None else x.new_zeros(y.shape[0])
        for start, stop, t in masked_tiles(x, y, exclusions, tile, lowest):
            shifted = t.add_(margin)  # excluded entries stay hugely negative: no hinge
            row[start:stop] = (shifted - d_row[start:stop, None]).clamp_(min=0).sum(1)
            if col is not None:
                col += (shifted - d_col[None, :]).clamp_(min=0).sum(0)
        ctx.margin, ctx.exclusions, ctx.tile = margin, exclusions, tile
        ctx.save_for_backward(x, y, d_row, d_col)
        return (row, col) if col is not None else (row, x.new_zeros(0))

    @staticmethod
    @once_differentiable
    def backward(ctx, g_row, g_col):
        x, y, d_row, d_col = ctx.saved_tensors
        lowest = torch.finfo(x.dtype).min
        dx, dy = torch.zeros_like(x), torch.zeros_like(y)
        count_row = x.new_zeros(x.shape[0])
        count_col = None if d_col is None else x.new_zeros(y.shape[0])
        for start, stop, t in masked_tiles(x, y, ctx.exclusions, ctx.tile, lowest):
            shifted = t.add_(ctx.margin)
            active = (shifted - d_row[start:stop, None] >= 0).to(x.dtype)
            count_row[start:stop] = active.sum(1)
            grad_s = active.mul_(g_row[start:stop, None])
            if count_col is not None:
                active = (shifted - d_col[None, :] >= 0).to(x.dtype)
                count_col += active.sum(0)
                grad_s += active.mul_(g_col[None, :])
            dx[start:stop] = grad_s @ y
            dy.addmm_(grad_s.t(), x[start:stop])
        grad_d_col = None if count_col is None else -g_col * count_col
        return dx, dy, -g_row * count_row, grad_d_col, None, None, None


@overload
def hinge_sums(
    x: torch.Tensor,
    y: torch.Tensor,
    d_row: torch.Tensor,
    d_col: torch.Tensor,
    *,
    margin: float,
    exclusions: Exclusions,
    tile: int,
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def hinge_sums(
    x: torch.Tensor,
    y: torch.Tensor,
    d_row: torch.Tensor,
    d_col: None,
    *,
    margin: float,
    exclusions: Exclusions,
    tile: int,
) -> tuple[torch.Tensor, None]: ...
def hinge_sums(
    x: torch.Tensor,
    y: torch.Tensor,
    d_row: torch.Tensor,
    d_col: torch.Tensor | None,
    *,
    margin: float,
    exclusions: Exclusions,
    tile: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sums of hinges over the negatives of every row (and column), differentiable.

    Args:
        x: ``(n, D)`` rows.
        y: ``(C, D)`` candidates.
        d_row: ``(n,)`` each row's positive score.
        d_col: ``(C,)`` each column's positive score (square mode), or ``None`` (rows only).
        margin: The hinge margin.
        exclusions: The entries that are not negatives.
        tile: Tile height.

    Returns:
        ``(row_sums, col_sums)``; ``col_sums`` is ``None`` without ``d_col``.
    """
    row, col = _HingeSums.apply(x, y, d_row, d_col, float(margin), exclusions, tile)
    return row, (col if d_col is not None else None)
