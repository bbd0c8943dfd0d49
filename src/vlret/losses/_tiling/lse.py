"""Log-sum-exp of the negatives, square (rows and columns at once) and rectangle (rows)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, overload

import torch
from torch.autograd.function import once_differentiable

from .tiles import Embedded, Exclusions, shard_directions, tiles

_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)


def _fast_floor(dtype: torch.dtype) -> float:
    """Smallest log of a shifted row / column sum the one-exponential path accepts.

    Entries of ``exp(s - K)`` below the smallest normal number are lost; demanding that the sum
    they belong to is at least ``e^40`` times larger keeps their share below ``e^-40``.
    """
    return math.log(torch.finfo(dtype).tiny) + 40.0


def _norm_shift(x: torch.Tensor, y: torch.Tensor, floor: float) -> torch.Tensor | None:
    """The fixed shift ``max|x| max|y|`` (base-2 units) of ``exp(s - K)`` tiles when no entry
    can fall below ``e^floor`` under it; ``None``: shift each tile by its maximum."""
    bound = _LOG2E * x.norm(dim=1).max() * y.norm(dim=1).max()
    return None if bool(2 * bound * _LN2 > -floor) else bound


def _exp_tile(x2, y, start, stop, exclusions, out, shift=None):
    """``(E, K)``: ``E = 2^(x2 y^T - K)`` of rows ``start:stop`` written into ``out``, the
    excluded entries zeroed; ``K = shift``, or the tile's maximum when ``shift`` is ``None``."""
    return _exp_of(
        torch.mm(x2[start:stop], y.t(), out=out[: stop - start]), start, exclusions, shift
    )


def _exp_of(logits2, start, exclusions, shift=None):
    """``_exp_tile`` of a tile of base-2 logits (rows from ``start``), in place."""
    if shift is None:
        shift = logits2.max()
    return exclusions.fill_(logits2.sub_(shift).exp2_(), start, 0.0), shift


#: ``product(start, stop, out)``: the base-2 logits of rows ``start:stop``, written into ``out``.
TileProduct = Callable[[int, int, torch.Tensor], torch.Tensor]


def square_lse_forward(ctx, x, y, exclusions, tile, product: TileProduct | None = None):
    """:class:`_SquareLSE`'s forward on ``ctx`` (its backward then applies); ``product`` gives
    each tile's base-2 logits ``x_I y^T log2(e)`` (default: that product), so that a caller can
    see each raw tile on the way (AdaCL's streamed anchor does)."""
    batch = x.shape[0]
    lowest = torch.finfo(x.dtype).min
    if product is None:
        x2 = x * _LOG2E

        def product(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
            return torch.mm(x2[start:stop], y.t(), out=out[: stop - start])

    floor = _fast_floor(x.dtype)
    fixed = _norm_shift(x, y, floor)
    row_lse, col_lse = x.new_empty(batch), x.new_full((batch,), lowest)
    shifts: list[float | None] = []
    kept = None
    buf = x.new_empty(min(tile, batch), batch)  # one tile, reused
    for start, stop in tiles(batch, tile):
        e, shift = _exp_of(product(start, stop, buf), start, exclusions, fixed)
        log_rows, log_cols = e.sum(1).log_(), e.sum(0).log_()
        if bool(torch.minimum(log_rows.min(), log_cols.min()) >= floor):
            row_lse[start:stop] = log_rows.add_(shift * _LN2)
            col_lse = torch.logaddexp(col_lse, log_cols.add_(shift * _LN2))
            shifts.append(float(shift))
            if stop - start == batch:  # a single tile: the backward reuses it
                kept = e
            continue
        del e, log_rows, log_cols
        row_lse[start:stop], cols = _careful_tile(x, y, exclusions, start, stop)
        col_lse = torch.logaddexp(col_lse, cols)
        shifts.append(None)
    ctx.tile, ctx.shifts, ctx.exclusions = tile, shifts, exclusions
    ctx.save_for_backward(x, y, row_lse, col_lse, *([] if kept is None else [kept]))
    return row_lse, col_lse


def _careful_tile(x, y, exclusions, start, stop):
    """Rows ``start:stop``: their negatives' log-sum-exp and the tile's column log-sum-exp,
    each computed stably (no shared exponential)."""
    t = exclusions.fill_(x[start:stop] @ y.t(), start, torch.finfo(x.dtype).min)
    return t.logsumexp(1), t.logsumexp(0)


class _SquareLSE(torch.autograd.Function):
    """Row and column log-sum-exps of the negatives of a square batch, one exponential per entry.

    ``E = exp(s - K)`` (computed as ``exp2`` in base-2 units, excluded entries zeroed) with one
    shift ``K`` per tile serves both directions: its row and column sums give the two
    log-sum-exps, and the backward's ``dL/dS`` is ``E_ij (a_i + b_j)`` with
    ``a_i = g_row_i e^{K - row_i}`` and ``b_j = g_col_j e^{K - col_j}``. ``K`` is the
    Cauchy-Schwarz bound of the norms when that leaves no entry below ``e^{-47}``, otherwise
    the tile's maximum. A tile where some row or column sum of ``E`` is so small that float
    underflow could matter (``_fast_floor``; also a line without negatives in the tile) is
    computed with one stable log-sum-exp per direction instead. With a single tile the
    forward's ``E`` is kept for the backward, as a saved tensor: the backward frees it (unless
    ``retain_graph``) even while the loss tensor is alive, as in gradient caching, where the
    encoders are re-run after ``loss.backward()``. Saved: ``X, Y``, the two vectors, one shift
    per tile.
    """

    @staticmethod
    def forward(ctx, x, y, exclusions, tile):
        return square_lse_forward(ctx, x, y, exclusions, tile)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_row, g_col):
        x, y, row_lse, col_lse, *kept = ctx.saved_tensors
        batch = x.shape[0]
        lowest = torch.finfo(x.dtype).min
        g_row, g_col = g_row.to(x.dtype), g_col.to(x.dtype)
        x2 = x * _LOG2E
        dx, dy = torch.zeros_like(x), torch.zeros_like(y)
        rows = min(ctx.tile, batch)
        buf = wbuf = None
        for (start, stop), shift in zip(tiles(batch, ctx.tile), ctx.shifts, strict=True):
            n = stop - start
            if shift is not None:
                wbuf = x.new_empty(rows, batch) if wbuf is None else wbuf
                e = kept[0] if kept else None
                if e is None:
                    buf = x.new_empty(rows, batch) if buf is None else buf
                    e, _ = _exp_tile(x2, y, start, stop, ctx.exclusions, buf, shift)
                a = g_row[start:stop] * torch.exp(shift * _LN2 - row_lse[start:stop])
                b = g_col * torch.exp(shift * _LN2 - col_lse)
                # not in place on e: a kept tile survives retain_graph
                grad_s = torch.add(a[:, None], b[None, :], out=wbuf[:n]).mul_(e)
            else:
                excluded = ctx.exclusions.mask(start, stop)
                t = (x[start:stop] @ y.t()).masked_fill_(excluded, lowest)
                # Excluded entries are zeroed explicitly: in a line without negatives they are 1.
                grad_s = (t - row_lse[start:stop, None]).exp_().masked_fill_(excluded, 0)
                grad_s.mul_(g_row[start:stop, None])
                col = t.sub_(col_lse[None, :]).exp_().masked_fill_(excluded, 0)
                grad_s += col.mul_(g_col[None, :])
            dx[start:stop].addmm_(grad_s, y)
            dy.addmm_(grad_s.t(), x[start:stop])
        return dx, dy, None, None


class _RowLSE(torch.autograd.Function):
    """Row log-sum-exps of the negatives of a rectangle (a shard, a queue block); each row is
    shifted by its own largest negative, so no entry that matters underflows. Saved: the
    inputs, the shifts and the result; the tiles are recomputed."""

    @staticmethod
    def forward(ctx, x, y, exclusions, tile):
        n = x.shape[0]
        lowest = torch.finfo(x.dtype).min
        x2 = x * _LOG2E
        shift, out = x.new_empty(n), x.new_empty(n)
        buf = x.new_empty(min(tile, n), y.shape[0])
        for start, stop in tiles(n, tile):
            t = exclusions.fill_(
                torch.mm(x2[start:stop], y.t(), out=buf[: stop - start]), start, lowest
            )
            top = t.amax(1)
            empty = top == lowest
            top = torch.where(empty, 0.0, top)  # no negatives: every entry becomes 0
            shift[start:stop] = top
            lse = t.sub_(top[:, None]).exp2_().sum(1).log_().add_(top * _LN2)
            out[start:stop] = torch.where(empty, lowest, lse)
        ctx.tile, ctx.exclusions = tile, exclusions
        ctx.save_for_backward(x, y, shift, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, y, shift, out = ctx.saved_tensors
        lowest = torch.finfo(x.dtype).min
        # dL/ds_kj = g_k softmax_k(j) = E_kj g_k e^{shift_k - lse_k}; nothing without negatives
        weight = torch.where(out > lowest, g.to(x.dtype) * torch.exp(shift * _LN2 - out), 0.0)
        x2 = x * _LOG2E
        need_y = ctx.needs_input_grad[1]
        dx = torch.zeros_like(x)
        dy = torch.zeros_like(y) if need_y else None
        buf = x.new_empty(min(ctx.tile, x.shape[0]), y.shape[0])
        for start, stop in tiles(x.shape[0], ctx.tile):
            t = torch.mm(x2[start:stop], y.t(), out=buf[: stop - start])
            grad_s = ctx.exclusions.fill_(t.sub_(shift[start:stop, None]).exp2_(), start, 0.0)
            grad_s.mul_(weight[start:stop, None])
            dx[start:stop] = grad_s @ y
            if dy is not None:  # need_y
                dy.addmm_(grad_s.t(), x[start:stop])
        return dx, dy, None, None


@overload
def negatives_lse(
    x: torch.Tensor, y: torch.Tensor, exclusions: Exclusions, tile: int, *, columns: Literal[False]
) -> torch.Tensor: ...
@overload
def negatives_lse(
    x: torch.Tensor, y: torch.Tensor, exclusions: Exclusions, tile: int, *, columns: Literal[True]
) -> tuple[torch.Tensor, torch.Tensor]: ...
def negatives_lse(
    x: torch.Tensor, y: torch.Tensor, exclusions: Exclusions, tile: int, *, columns: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``log sum_{j negative} exp(x_i . y_j)`` per row (and per column), differentiable.

    Args:
        x: ``(n, D)`` rows; scale the logits by passing ``x * c`` (``c`` then gets its
            gradient through autograd).
        y: ``(C, D)`` candidates; queue keys that do not require grad get none.
        exclusions: The entries that are not negatives.
        tile: Tile height.
        columns: Square mode (``n == C``): also every column's log-sum-exp over all rows,
            sharing one exponential per entry with the rows.

    Returns:
        ``row_lse`` ``(n,)``, or ``(row_lse, col_lse)`` with ``columns``. A line without
        negatives gives the dtype's most negative finite value.
    """
    if columns:
        return _SquareLSE.apply(x, y, exclusions, tile)
    return _RowLSE.apply(x, y, exclusions, tile)


def log1p_exp(z: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(z))`` stably (``softplus``; ``z`` may be the most negative float)."""
    return torch.logaddexp(z.new_zeros(()), z)


def softmax_terms(
    batch: Embedded,
    scale: torch.Tensor,
    margins: torch.Tensor | None,
    shard: object | None,
) -> torch.Tensor:
    """Per index ``log(1 + sum_{j neg} e^{c (s_ij - s_ii + m_i)})`` plus the same over column
    ``i``: InfoNCE (``c = 1/tau``, no margin) and Unified (``c = gamma``) are this form.

    Args:
        batch: The prepared batch.
        scale: ``c``, a 0-dim tensor (it gets its gradient when it requires one).
        margins: ``(B,)`` margins ``m_i`` or ``None``.
        shard: ``(start, stop)`` for the terms of a shard only, or ``None``.

    Returns:
        ``(B,)`` terms, or ``(stop - start,)`` for a shard.
    """
    if shard is None:
        x, y = batch.x, batch.y
        diag = (x * y).sum(1)
        offset = scale * (diag if margins is None else diag - margins)
        exclusions = batch.exclusions
        rows, cols = negatives_lse(x * scale, y, exclusions, batch.tile, columns=True)
        return log1p_exp(rows - offset) + log1p_exp(cols - offset)
    terms = []
    for d in shard_directions(batch, shard):
        pos = d.positives
        offset = scale * (pos if margins is None else pos - margins[d.pair])
        lse = negatives_lse(d.rows * scale, d.cands, d.exclusions, batch.tile, columns=False)
        terms.append(log1p_exp(lse - offset))
    return terms[0] + terms[1]
