"""The streaming engine: losses over tiles of the similarity matrix, never the whole matrix.

A dense loss builds ``S = X Y^T`` (``B x B``) and lets autograd keep it and its gradient. The
primitives here take the embeddings and stream **tiles** (blocks of rows ``S[I, :] = X[I] Y^T``
of ``tile`` rows), keep ``O(B)`` statistics per row and per column, and recompute the tiles in
the backward pass. Peak extra memory is ``O(tile * B)``.

Each primitive has a **square** mode (the ``(B, B)`` batch, rows and columns at once) and a
**rectangle** mode (rows only: the local **shard** of a data-parallel rank against the gathered
batch, or a block of memory-queue keys). Which entries of a tile are not negatives is an
:class:`Exclusions` object: the id matches and the diagonal (square), the id matches and each
row's own pair (shard), the empty or same-id slots (queue).

Primitives:

* :func:`negatives_lse`: ``log sum_{j negative} exp(x_i . y_j)`` per row (and per column),
  differentiable. InfoNCE, Unified and AdaCL are ``log(1 + exp(lse_i - offset_i))`` on it.
* :func:`hardest_negatives`: the largest negative score of each row (and column) and its index,
  without gradient; a loss differentiates ``(x * y[index]).sum(1)`` (autograd's gather
  backward is the scatter).
* :func:`hinge_sums`: ``sum_j [margin + s_ij - d_i]_+`` over the negatives, differentiable in
  the embeddings and in the offsets ``d``.

Semantics shared with the dense losses: a line without negatives gives the dtype's most
negative finite value (never ``-inf``), half-precision inputs are computed in float32, ties of
the hardest negative go to the lowest index.

The module imports no loss family; each family file builds its tiled form on these primitives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .._checks import check_embeddings, check_finite, compute_dtype
from ..similarity import Ids, _ids_to_tensor

#: Image and text id codes sharing one coding, or ``None`` (each pair is its own id).
Codes = tuple[torch.Tensor, torch.Tensor] | None

# Same norm clamp as ``similarity.cosine_similarity``, so normalize=True matches the dense path.
_NORM_EPS = 1e-8
_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)


def tiles(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of the consecutive tiles of ``size`` rows covering ``range(n)``."""
    for start in range(0, n, size):
        yield start, min(start + size, n)


def check_shard(shard: object, batch: int) -> tuple[int, int]:
    """``shard`` as ``(start, stop)`` with ``0 <= start < stop <= batch``.

    Raises:
        ValueError: ``shard`` is not such a pair of ints.
    """
    ok = (
        isinstance(shard, tuple | list)
        and len(shard) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
        and 0 <= shard[0] < shard[1] <= batch
    )
    if not ok:
        raise ValueError(
            f"shard must be (start, stop) with 0 <= start < stop <= {batch}, got {shard!r}"
        )
    return int(shard[0]), int(shard[1])


@dataclass(frozen=True)
class Embedded:
    """Validated embeddings of a batch: ``x``, ``y`` in the compute dtype (normalised when
    asked), the id ``codes`` and the ``tile`` height."""

    x: torch.Tensor
    y: torch.Tensor
    codes: Codes
    tile: int

    @property
    def batch(self) -> int:
        return self.x.shape[0]


def _codes(img_ids: Ids | None, txt_ids: Ids | None, batch: int, device) -> Codes:
    """Ids as two integer tensors with a shared coding (same rules as ``PairLoss``)."""
    if img_ids is None and txt_ids is None:
        return None
    if img_ids is None:
        raise ValueError("txt_ids given without img_ids; pass img_ids (and optionally txt_ids)")
    if txt_ids is None:
        txt_ids = img_ids
    if isinstance(img_ids, torch.Tensor) != isinstance(txt_ids, torch.Tensor):
        raise ValueError("img_ids and txt_ids must both be tensors or both be sequences")
    lookup: dict = {}
    out = []
    for name, ids in (("img_ids", img_ids), ("txt_ids", txt_ids)):
        codes = _ids_to_tensor(ids, name, lookup, device)
        if len(codes) != batch:
            raise ValueError(f"{name} must have one id per row ({batch}), got {len(codes)}")
        out.append(codes.to(device))
    return out[0], out[1]


def prepare_embeddings(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    img_ids: Ids | None,
    txt_ids: Ids | None,
    *,
    chunk_size: int,
    normalize: bool,
) -> Embedded:
    """Validate a batch for a tiled loss.

    Args:
        img_emb: ``(B, D)`` image embeddings, ``B >= 2``.
        txt_emb: ``(B, D)`` text embeddings.
        img_ids: Optional ids marking further positives (``PairLoss`` rules).
        txt_ids: Optional ids of the texts' images (default ``img_ids``).
        chunk_size: Tile height, a positive int.
        normalize: L2-normalise the embeddings (cosine scores) or keep raw dot products.

    Returns:
        The :class:`Embedded` batch, float32 or wider.

    Raises:
        ValueError: Bad shapes, ids, ``chunk_size`` or non-finite values, naming the argument.
    """
    check_embeddings(img_emb, txt_emb)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    batch = img_emb.shape[0]
    if batch < 2:
        raise ValueError(f"img_emb needs a batch size of at least 2 to have negatives, got {batch}")
    dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
    x, y = img_emb.to(dtype), txt_emb.to(dtype)
    check_finite(x, "img_emb")
    check_finite(y, "txt_emb")
    if normalize:
        x, y = F.normalize(x, dim=1, eps=_NORM_EPS), F.normalize(y, dim=1, eps=_NORM_EPS)
    return Embedded(x, y, _codes(img_ids, txt_ids, batch, x.device), chunk_size)


# ----------------------------------------------------------------------------- exclusions


class Exclusions:
    """Which entries of a tile of scores are not negatives (positives, empty queue slots)."""

    def fill_(self, t: torch.Tensor, start: int, value: float) -> torch.Tensor:
        """Set the excluded entries of rows ``start:start + len(t)`` to ``value``, in place."""
        return t.masked_fill_(self.mask(start, start + t.shape[0]), value)

    def mask(self, start: int, stop: int) -> torch.Tensor:
        """Bool ``(stop - start, C)``: the excluded entries of rows ``start:stop``."""
        raise NotImplementedError


class PairExclusions(Exclusions):
    """Rows against candidates where row ``k``'s own pair is candidate ``pair[k]`` and equal
    id codes mark further positives (``pair=None``: the diagonal, the square batch)."""

    def __init__(
        self,
        row_codes: torch.Tensor | None,
        col_codes: torch.Tensor | None,
        pair: torch.Tensor | None,
        width: int,
    ) -> None:
        self.row_codes, self.col_codes, self.pair, self.width = row_codes, col_codes, pair, width

    def fill_(self, t: torch.Tensor, start: int, value: float) -> torch.Tensor:
        n = t.shape[0]
        if self.row_codes is not None:
            t.masked_fill_(
                self.row_codes[start : start + n, None] == self.col_codes[None, :], value
            )
        if self.pair is None:
            t.diagonal(start).fill_(value)
        else:
            t[torch.arange(n, device=t.device), self.pair[start : start + n]] = value
        return t

    def mask(self, start: int, stop: int) -> torch.Tensor:
        device = self.pair.device if self.pair is not None else None
        if self.row_codes is not None:
            device = self.row_codes.device
        t = torch.zeros(stop - start, self.width, dtype=torch.bool, device=device)
        return self.fill_(t, start, True)


def SquareExclusions(codes: Codes, batch: int) -> PairExclusions:  # noqa: N802 (a constructor)
    """The exclusions of a ``(B, B)`` batch: id matches and the diagonal."""
    rows, cols = (None, None) if codes is None else codes
    return PairExclusions(rows, cols, None, batch)


@dataclass(frozen=True)
class QueueBlock:
    """Memory-queue negatives of one direction.

    Attributes:
        keys: ``(K, D)`` queued embeddings (constants, no gradient).
        valid: ``(K,)`` bool, the filled slots.
        ids: Optional ``(K,)`` ids of the entries.
        anchor_ids: Optional ``(B,)`` ids of the anchors; an entry with the anchor's id is no
            negative of it (as ``MemoryQueue.negative_mask``).
    """

    keys: torch.Tensor
    valid: torch.Tensor
    ids: torch.Tensor | None = None
    anchor_ids: torch.Tensor | None = None


class QueueExclusions(Exclusions):
    """Anchors against a :class:`QueueBlock`: empty slots and entries with the anchor's id."""

    def __init__(self, block: QueueBlock) -> None:
        self.block = block

    def mask(self, start: int, stop: int) -> torch.Tensor:
        b = self.block
        if b.ids is None or b.anchor_ids is None:
            return (~b.valid)[None, :].expand(stop - start, -1)
        return ~(b.valid[None, :] & (b.ids[None, :] != b.anchor_ids[start:stop, None]))


def masked_tiles(
    x: torch.Tensor, y: torch.Tensor, exclusions: Exclusions, tile: int, fill: float
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, t)`` per tile, ``t = x[start:stop] @ y.T`` with excluded entries set to
    ``fill``; computed without gradient."""
    with torch.no_grad():
        for start, stop in tiles(x.shape[0], tile):
            yield start, stop, exclusions.fill_(x[start:stop] @ y.t(), start, fill)


# ----------------------------------------------------------------------------- hardest negative


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


# ----------------------------------------------------------------------------- hinge sums


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
        x: ``(n, D)`` rows; y: ``(C, D)`` candidates.
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


# ----------------------------------------------------------------------------- log-sum-exp


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
    e = torch.mm(x2[start:stop], y.t(), out=out[: stop - start])
    if shift is None:
        shift = e.max()
    return exclusions.fill_(e.sub_(shift).exp2_(), start, 0.0), shift


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
    forward's ``E`` is kept for the backward. Saved: ``X, Y``, the two vectors, one shift per
    tile.
    """

    @staticmethod
    def forward(ctx, x, y, exclusions, tile):
        batch = x.shape[0]
        lowest = torch.finfo(x.dtype).min
        x2 = x * _LOG2E
        floor = _fast_floor(x.dtype)
        fixed = _norm_shift(x, y, floor)
        row_lse, col_lse = x.new_empty(batch), x.new_full((batch,), lowest)
        shifts: list[float | None] = []
        buf = x.new_empty(min(tile, batch), batch)  # one tile, reused
        for start, stop in tiles(batch, tile):
            e, shift = _exp_tile(x2, y, start, stop, exclusions, buf, fixed)
            log_rows, log_cols = e.sum(1).log_(), e.sum(0).log_()
            if bool(torch.minimum(log_rows.min(), log_cols.min()) >= floor):
                row_lse[start:stop] = log_rows.add_(shift * _LN2)
                col_lse = torch.logaddexp(col_lse, log_cols.add_(shift * _LN2))
                shifts.append(float(shift))
                if stop - start == batch:  # a single tile: the backward reuses it
                    ctx.kept = e
                continue
            del e, log_rows, log_cols
            row_lse[start:stop], cols = _careful_tile(x, y, exclusions, start, stop)
            col_lse = torch.logaddexp(col_lse, cols)
            shifts.append(None)
        ctx.tile, ctx.shifts, ctx.exclusions = tile, shifts, exclusions
        ctx.save_for_backward(x, y, row_lse, col_lse)
        return row_lse, col_lse

    @staticmethod
    @once_differentiable
    def backward(ctx, g_row, g_col):
        x, y, row_lse, col_lse = ctx.saved_tensors
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
                e = getattr(ctx, "kept", None)
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
            if need_y:
                dy.addmm_(grad_s.t(), x[start:stop])
        return dx, dy, None, None


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


# ----------------------------------------------------------------------------- shards


@dataclass(frozen=True)
class Direction:
    """One direction of a shard: ``rows`` (the shard's anchors, ``(n, D)``) against all
    ``cands`` (``(B, D)``); anchor ``k``'s own pair is candidate ``pair[k]``."""

    rows: torch.Tensor
    cands: torch.Tensor
    pair: torch.Tensor
    exclusions: PairExclusions

    @property
    def positives(self) -> torch.Tensor:
        """``(n,)`` the anchors' positive scores (differentiable)."""
        return (self.rows * self.cands[self.pair]).sum(1)


def shard_directions(batch: Embedded, shard: object) -> tuple[Direction, Direction]:
    """The image anchors and the text anchors of ``shard`` as two rectangles.

    A rank that holds pairs ``start:stop`` of an all-gathered batch computes only their terms:
    image anchor ``i`` against every text and text anchor ``i`` against every image. Summed
    over ranks (through a gather whose backward sums the gradients, e.g.
    ``torch.distributed.nn.functional.all_gather``) they are the loss of the whole batch.

    Raises:
        ValueError: ``shard`` is not ``(start, stop)`` inside the batch.
    """
    start, stop = check_shard(shard, batch.batch)
    pair = torch.arange(start, stop, device=batch.x.device)
    img, txt = (None, None) if batch.codes is None else batch.codes
    out = []
    for rows, cands, row_codes, cand_codes in (
        (batch.x, batch.y, img, txt),
        (batch.y, batch.x, txt, img),
    ):
        local = None if row_codes is None else row_codes[start:stop]
        exclusions = PairExclusions(local, cand_codes, pair, batch.batch)
        out.append(Direction(rows[start:stop], cands, pair, exclusions))
    return out[0], out[1]


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
        exclusions = SquareExclusions(batch.codes, batch.batch)
        rows, cols = negatives_lse(x * scale, y, exclusions, batch.tile, columns=True)
        return log1p_exp(rows - offset) + log1p_exp(cols - offset)
    terms = []
    for d in shard_directions(batch, shard):
        pos = d.positives
        offset = scale * (pos if margins is None else pos - margins[d.pair])
        lse = negatives_lse(d.rows * scale, d.cands, d.exclusions, batch.tile, columns=False)
        terms.append(log1p_exp(lse - offset))
    return terms[0] + terms[1]


__all__ = [
    "Codes",
    "Direction",
    "Embedded",
    "Exclusions",
    "PairExclusions",
    "QueueBlock",
    "QueueExclusions",
    "SquareExclusions",
    "check_shard",
    "hardest_negatives",
    "hinge_sums",
    "log1p_exp",
    "masked_tiles",
    "negatives_lse",
    "prepare_embeddings",
    "shard_directions",
    "softmax_terms",
    "tiles",
]
