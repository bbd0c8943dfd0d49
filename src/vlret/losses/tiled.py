"""O(B)-memory tiled forms of InfoNCE, Unified, Triplet (hardest and sum), AdaCL and GOAL, issue 8.

The dense losses build the ``(B, B)`` similarity matrix ``S = X Y^T`` and let autograd keep it
(and its gradient). The functions here take the embeddings and never hold it: a custom
``autograd.Function`` streams row strips ``S[I, :] = X[I] Y^T`` of ``chunk_size`` rows, keeps
``O(B)`` per-row and per-column statistics, and the backward recomputes the strips to
accumulate ``dX = G Y`` and ``dY = G^T X`` strip by strip. Peak extra memory is
``O(chunk_size * B)`` for one strip and its temporaries, plus ``O(B)`` saved statistics.

Semantics are those of the dense functions in ``infonce.py``, ``unified.py``, ``triplet.py``,
``adacl.py`` (:func:`adacl_loss` for given margins, in-batch negatives) and ``goal.py``:
the per-index vector (``reduction="none"``) is the image-anchor term of row ``i`` plus the
text-anchor term of column ``i``; ids mark further positives, which are neither negatives nor
pulled; the diagonal is always positive; a row without negatives contributes a graph-attached
zero; half-precision inputs are computed in float32 (gradients are cast back by autograd).

Tie rule (hardest triplet, GOAL): when several negatives share the largest similarity, the
tiled backward sends the whole gradient to the lowest index (first column for an image anchor,
first row for a text anchor). The dense triplet ``amax`` splits it evenly among them (the value
is the same); the dense GOAL takes ``torch.max``'s index, the first maximal one, so the two GOAL
forms agree on ties too. A hinge that is exactly zero gets a zero gradient. Ties have measure
zero on real data.

Local anchors (``anchors=(start, stop)``; InfoNCE, Unified, Triplet, GOAL): for data-parallel
training, a rank that holds pairs ``start:stop`` of an all-gathered batch computes only the
terms of those indices -- image anchor ``i`` against all ``B`` texts and text anchor ``i``
against all ``B`` images, two ``(n, B)`` rectangles -- instead of the whole ``(B, B)`` square.
``"none"`` returns the ``(n,)`` terms, ``"sum"`` their sum, ``"mean"`` their sum divided by
``B``, so the ranks' values add up to the loss of the whole batch; with a gather whose
backward sums the ranks' gradients (``torch.distributed.nn.functional.all_gather``) the
gradients add up too. GOAL's MS sets draw on every positive of the batch, which each rank
computes from the gathered embeddings. AdaCL's anchor is a batch-level selection and has no
local form.

See ``docs/tiled.md`` for how a module's embedding entry point calls these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .._checks import (
    check_embeddings,
    check_finite,
    check_reduction,
    compute_dtype,
)
from ..similarity import Ids, _ids_to_tensor

__all__ = ["QueueBlock", "TiledAdaCLBatch", "tiled_adacl_loss"]

# Same norm clamp as ``similarity.cosine_similarity``, so normalize=True matches the dense path.
_NORM_EPS = 1e-8

Codes = tuple[torch.Tensor, torch.Tensor] | None


# ----------------------------------------------------------------------------- shared helpers


def _strips(batch: int, chunk: int) -> Iterator[tuple[int, int]]:
    for start in range(0, batch, chunk):
        yield start, min(start + chunk, batch)


def _positives(codes: Codes, start: int, stop: int, batch: int, device) -> torch.Tensor:
    """Bool ``(stop - start, B)`` mask of the positives of rows ``start:stop``, diagonal in."""
    if codes is None:
        pos = torch.zeros(stop - start, batch, dtype=torch.bool, device=device)
    else:
        pos = codes[0][start:stop, None] == codes[1][None, :]
    rows = torch.arange(start, stop, device=device)
    pos[rows - start, rows] = True
    return pos


def _reduce(per_index: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return per_index
    if reduction == "sum":
        return per_index.sum()
    return per_index.mean()


def _per_index_grad(grad_out: torch.Tensor, reduction: str, batch: int) -> torch.Tensor:
    """The incoming gradient as one weight per index ``i`` (shared by row i and column i)."""
    if reduction == "none":
        return grad_out
    if reduction == "sum":
        return grad_out.expand(batch)
    return (grad_out / batch).expand(batch)


def _check_chunk(chunk_size: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return chunk_size


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


def _prepare(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    img_ids: Ids | None,
    txt_ids: Ids | None,
    *,
    chunk_size: int,
    reduction: str,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor, Codes, int]:
    """Validate; return the (normalised) embeddings in the compute dtype, the id codes, chunk."""
    check_embeddings(img_emb, txt_emb)
    check_reduction(reduction)
    chunk = _check_chunk(chunk_size)
    batch = img_emb.shape[0]
    if batch < 2:
        raise ValueError(f"img_emb needs a batch size of at least 2 to have negatives, got {batch}")
    dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
    x, y = img_emb.to(dtype), txt_emb.to(dtype)
    check_finite(x, "img_emb")
    check_finite(y, "txt_emb")
    if normalize:
        x, y = F.normalize(x, dim=1, eps=_NORM_EPS), F.normalize(y, dim=1, eps=_NORM_EPS)
    return x, y, _codes(img_ids, txt_ids, batch, x.device), chunk


def _split_codes(codes: Codes) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return (None, None) if codes is None else codes


# ----------------------------------------------------------------------------- log-sum-exp losses


_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)


def _fill_positives(
    t: torch.Tensor, codes: Codes, start: int, fill: float, pair: torch.Tensor | None = None
) -> torch.Tensor:
    """Fill the positives of the row strip ``t`` (rows ``start:``) with ``fill``, in place: the
    id matches and each row's own pair, column ``pair[row]`` (``None``: the diagonal)."""
    n = t.shape[0]
    if codes is not None:
        t.masked_fill_(codes[0][start : start + n, None] == codes[1][None, :], fill)
    if pair is None:
        t.diagonal(start).fill_(fill)
    else:
        t[torch.arange(n, device=t.device), pair[start : start + n]] = fill
    return t


def _fast_floor(dtype: torch.dtype) -> float:
    """Smallest log of a shifted row / column sum the one-exponential path accepts.

    Entries of ``exp(c s - K)`` below the smallest normal number are lost; demanding that the
    sum they belong to is at least ``e^40`` times larger keeps their share below ``e^-40``.
    """
    return math.log(torch.finfo(dtype).tiny) + 40.0


def _norm_shift(x: torch.Tensor, y: torch.Tensor, scale, floor: float) -> torch.Tensor | None:
    """The fixed shift ``c max|x| max|y|`` (base-2 units) of ``exp(c s - K)`` strips when no
    entry can fall below ``e^floor`` under it; ``None``: shift each strip by its maximum."""
    bound = (scale * _LOG2E) * x.norm(dim=1).max() * y.norm(dim=1).max()
    return None if bool(2 * bound * _LN2 > -floor) else bound


def _exp_strip(xc, y, start: int, stop: int, codes: Codes, out: torch.Tensor, shift=None):
    """``(E, K)``: ``E = 2^(xc y^T - K)`` of rows ``start:stop`` written into ``out``, the
    positives zeroed; ``K = shift``, or the strip's maximum when ``shift`` is ``None``."""
    e = torch.mm(xc[start:stop], y.t(), out=out[: stop - start])
    if shift is None:
        shift = e.max()
    return _fill_positives(e.sub_(shift).exp2_(), codes, start, 0.0), shift


# ----------------------------------------------------------------------------- AdaCL


class _TiledNegativeLogSumExp(torch.autograd.Function):
    """``(log sum_{j neg} e^{s_ij}, log sum_{i neg} e^{s_ij})``: the log-sum-exp of every row's
    and every column's negatives, two ``(B,)`` outputs (``log Sigma`` of AdaCL Eq. 3).

    A line without negatives gives ``finfo.min`` (the dense sentinel), never ``-inf``. Saved for
    backward: ``X, Y``, the two vectors and one shift per strip; the backward recomputes each
    strip and accumulates ``G = g_row[i] P_ij + g_col[j] Q_ij`` into ``dX`` and ``dY``.

    Speed as :class:`_TiledPairLogSumExp`: one exponential per entry, ``E = exp(s - K)`` (as
    ``exp2``, positives zeroed) with a per-strip shift ``K`` (the norm bound when it leaves no
    entry below ``e^{-47}``, else the strip's maximum), serves both directions, and the
    backward's ``G`` is ``E_ij (a_i + b_j)`` with ``a_i = g_row[i] e^{K - row_i}``,
    ``b_j = g_col[j] e^{K - col_j}``. A strip where some row or column sum of ``E`` falls below
    ``_fast_floor`` (underflow, or a line of the strip without negatives) is computed the
    careful way: one stable log-sum-exp per direction.
    """

    @staticmethod
    def forward(ctx, x, y, img_codes, txt_codes, chunk):
        batch = x.shape[0]
        codes = None if img_codes is None else (img_codes, txt_codes)
        lowest = torch.finfo(x.dtype).min
        xc = x * _LOG2E
        floor = _fast_floor(x.dtype)
        fixed = _norm_shift(x, y, 1.0, floor)
        row_lse = x.new_empty(batch)
        col_lse = x.new_full((batch,), lowest)
        shifts: list[float | None] = []
        buf = x.new_empty(min(chunk, batch), batch)  # one strip, reused
        for start, stop in _strips(batch, chunk):
            e, shift = _exp_strip(xc, y, start, stop, codes, buf, fixed)
            log_rows, log_cols = e.sum(1).log_(), e.sum(0).log_()
            if bool(torch.minimum(log_rows.min(), log_cols.min()) >= floor):
                row_lse[start:stop] = log_rows.add_(shift * _LN2)
                col_lse = torch.logaddexp(col_lse, log_cols.add_(shift * _LN2))
                shifts.append(float(shift))
                continue
            pos = _positives(codes, start, stop, batch, x.device)
            a = (x[start:stop] @ y.t()).masked_fill_(pos, lowest)
            row_lse[start:stop] = a.logsumexp(1)
            col_lse = torch.logaddexp(col_lse, a.logsumexp(0))
            shifts.append(None)
        ctx.chunk, ctx.shifts = chunk, shifts
        ctx.save_for_backward(x, y, img_codes, txt_codes, row_lse, col_lse)
        return row_lse, col_lse

    @staticmethod
    @once_differentiable
    def backward(ctx, g_row, g_col):
        x, y, img_codes, txt_codes, row_lse, col_lse = ctx.saved_tensors
        batch = x.shape[0]
        codes = None if img_codes is None else (img_codes, txt_codes)
        lowest = torch.finfo(x.dtype).min
        g_row, g_col = g_row.to(x.dtype), g_col.to(x.dtype)
        xc = x * _LOG2E
        dx, dy = torch.zeros_like(x), torch.zeros_like(y)
        buf = wbuf = None
        for (start, stop), shift in zip(_strips(batch, ctx.chunk), ctx.shifts, strict=True):
            n = stop - start
            if shift is not None:
                if buf is None:
                    rows = min(ctx.chunk, batch)
                    buf, wbuf = x.new_empty(rows, batch), x.new_empty(rows, batch)
                e, _ = _exp_strip(xc, y, start, stop, codes, buf, shift)
                a = g_row[start:stop] * torch.exp(shift * _LN2 - row_lse[start:stop])
                b = g_col * torch.exp(shift * _LN2 - col_lse)
                grad_s = torch.add(a[:, None], b[None, :], out=wbuf[:n]).mul_(e)
            else:
                pos = _positives(codes, start, stop, batch, x.device)
                t = (x[start:stop] @ y.t()).masked_fill_(pos, lowest)
                # Positives are zeroed explicitly: in a line without negatives they are exp(0).
                grad_s = (t - row_lse[start:stop, None]).exp_().masked_fill_(pos, 0)
                grad_s.mul_(g_row[start:stop, None])
                col = t.sub_(col_lse[None, :]).exp_().masked_fill_(pos, 0).mul_(g_col[None, :])
                grad_s += col
            dx[start:stop].addmm_(grad_s, y)
            dy.addmm_(grad_s.t(), x[start:stop])
        return dx, dy, None, None, None


def _check_adacl_margin(value: float | torch.Tensor, name: str, *, positive: bool) -> None:
    """Same rule as ``adacl_loss``: a real number or a 0-dim tensor, finite (``m1`` > 0)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        v = float(value.detach())
    elif isinstance(value, int | float) and not isinstance(value, bool):
        v = float(value)
    else:
        raise ValueError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(v) or (positive and v <= 0):
        kind = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {v!r}")


def tiled_adacl_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    m1: float | torch.Tensor,
    m2: float | torch.Tensor,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
) -> torch.Tensor:
    """Tiled :func:`~vlret.losses.adacl_loss` for given margins, in-batch negatives only.

    Per index ``i``: ``log(1 + exp(L_i - m1 (s_ii - m2)))`` with ``L_i`` the log-sum-exp of row
    ``i``'s negatives, plus the same over column ``i``. The two ``(B,)`` log-sum-exp vectors
    come from a tiled Function; the rest is ``O(B)`` autograd, so ``m1``/``m2`` tensors that
    require grad receive their gradient as in the dense form. Memory-queue negatives
    (``extra_neg_*``) have no tiled counterpart yet (``docs/tiled.md``).
    """
    _check_adacl_margin(m1, "m1", positive=True)
    _check_adacl_margin(m2, "m2", positive=False)
    check_reduction(reduction)
    batch = TiledAdaCLBatch(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    return batch.loss(m1, m2, reduction)


#: Bins of the delta histogram that locates the median clone (Eq. 11) in two passes.
_DELTA_BINS = 65536
#: A median bin holding more than this many clones per row is refined by another histogram.
_BIN_CAP_PER_ROW = 64


@dataclass(frozen=True)
class QueueBlock:
    """Memory-queue negatives of one direction: ``keys`` ``(K, D)`` (no gradient), ``valid``
    ``(K,)``, and optionally the entries' ``ids`` ``(K,)`` with the anchors' ``anchor_ids``
    ``(B,)``: entry ``k`` is a negative of anchor ``i`` when it is filled and (with ids) its id
    differs, as ``MemoryQueue.negative_mask``."""

    keys: torch.Tensor
    valid: torch.Tensor
    ids: torch.Tensor | None = None
    anchor_ids: torch.Tensor | None = None

    def allowed(self, start: int, stop: int) -> torch.Tensor:
        """Bool ``(stop - start, K)``: the negatives of anchors ``start:stop``."""
        if self.ids is None or self.anchor_ids is None:
            return self.valid[None, :].expand(stop - start, -1)
        return self.valid[None, :] & (self.ids[None, :] != self.anchor_ids[start:stop, None])


class _TiledQueueLogSumExp(torch.autograd.Function):
    """``log sum_{k negative} exp(a_i . q_k)`` per anchor against a queue block, ``(B,)``;
    ``finfo.min`` for an anchor without queue negatives. Gradient to ``a`` only (queue keys are
    constants). Strips of ``chunk_size`` anchors x ``K`` keys."""

    @staticmethod
    def forward(ctx, a, keys, block, chunk):
        lowest = torch.finfo(a.dtype).min
        out = a.new_empty(a.shape[0])
        for start, stop in _strips(a.shape[0], chunk):
            t = (a[start:stop] @ keys.t()).masked_fill_(~block.allowed(start, stop), lowest)
            out[start:stop] = t.logsumexp(1)
        ctx.block, ctx.chunk = block, chunk
        ctx.save_for_backward(a, keys, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        a, keys, out = ctx.saved_tensors
        lowest = torch.finfo(a.dtype).min
        g = torch.where(out > lowest, g, 0.0)  # no queue negatives: nothing to differentiate
        da = torch.empty_like(a)
        for start, stop in _strips(a.shape[0], ctx.chunk):
            t = (a[start:stop] @ keys.t()).masked_fill_(~ctx.block.allowed(start, stop), lowest)
            w = t.sub_(out[start:stop, None]).exp_().mul_(g[start:stop, None])
            da[start:stop] = w @ keys
        return da, None, None, None


class TiledAdaCLBatch:
    """One batch of :class:`~vlret.losses.AdaCLLoss` with ``chunk_size``.

    Everything the module needs, without the ``(B, B)`` matrix: the negatives' log-sum-exps
    (:meth:`negatives_lse`: ``_TiledNegativeLogSumExp`` on the batch, ``_TiledQueueLogSumExp``
    on the memory-queue blocks ``queue_txt`` (texts, negatives of the image rows) and
    ``queue_img`` (images, negatives of the text columns)), Eq. (3) given the margins
    (:meth:`loss`), and the anchor of Eq. (7)-(11) (:meth:`anchor`, no gradient), equal to
    ``adacl.adacl_anchor`` on the dense blocks: the same salient rows, GDA, clone set S*, count
    and selection rule, including its tie rule (the first clone in flat order -- the ``B x B``
    block row-major, then the ``B x K`` queue block -- among equal deltas). The selection
    streams strips: pass 1 the salient scores (row sums of the negatives), then the two chosen
    rows, pass 2 ``|S*|`` and, for ``"median"``, a ``65536``-bin histogram of ``Delta S`` over
    ``[0, 2 max|x| max|y, q|]`` (Cauchy-Schwarz bounds every delta), pass 3 the clones of the
    median's bin only (refined by further histograms while that bin holds more than ``64 B``
    clones). ``"min"``/``"max"`` need pass 2 only, ``"random"`` one more strip. Each pass costs
    one strip product per strip, so the update costs about three forward passes; memory stays
    ``O(chunk_size x (B + K))``.
    """

    def __init__(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        chunk_size: int,
        normalize: bool = True,
        queue_txt: QueueBlock | None = None,
        queue_img: QueueBlock | None = None,
    ) -> None:
        self.x, self.y, self.codes, self.chunk = _prepare(
            img_emb,
            txt_emb,
            img_ids,
            txt_ids,
            chunk_size=chunk_size,
            reduction="sum",
            normalize=normalize,
        )
        self.size = self.x.shape[0]
        self.queue_txt, self.queue_img = (
            None
            if q is None
            else QueueBlock(
                q.keys.to(device=self.x.device, dtype=self.x.dtype),
                q.valid.to(self.x.device),
                None if q.ids is None else q.ids.to(self.x.device),
                None if q.anchor_ids is None else q.anchor_ids.to(self.x.device),
            )
            for q in (queue_txt, queue_img)
        )

    def negatives_lse(self, scale: float | torch.Tensor = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``log sum_neg exp(scale * s)`` of every row and every column (``log Sigma``)."""
        if isinstance(scale, torch.Tensor):
            scale = scale.to(device=self.x.device, dtype=self.x.dtype)
        one = not isinstance(scale, torch.Tensor) and scale == 1.0
        x = self.x if one else self.x * scale
        y = self.y if one else self.y * scale
        rows, cols = _TiledNegativeLogSumExp.apply(x, self.y, *_split_codes(self.codes), self.chunk)
        if self.queue_txt is not None:
            queue = _TiledQueueLogSumExp.apply(x, self.queue_txt.keys, self.queue_txt, self.chunk)
            rows = torch.logaddexp(rows, queue)
        if self.queue_img is not None:
            queue = _TiledQueueLogSumExp.apply(y, self.queue_img.keys, self.queue_img, self.chunk)
            cols = torch.logaddexp(cols, queue)
        return rows, cols

    def loss(
        self,
        m1: float | torch.Tensor,
        m2: float | torch.Tensor,
        reduction: str,
        lse: tuple[torch.Tensor, torch.Tensor] | None = None,
        scale: float | torch.Tensor = 1.0,
    ) -> torch.Tensor:
        """Eq. (3) in both directions with negative logits ``scale * s`` (``lse`` if known)."""
        x, y = self.x, self.y
        if isinstance(m1, torch.Tensor):
            m1 = m1.to(device=x.device, dtype=x.dtype)
        if isinstance(m2, torch.Tensor):
            m2 = m2.to(device=x.device, dtype=x.dtype)
        lse_row, lse_col = self.negatives_lse(scale) if lse is None else lse
        pos_logit = m1 * ((x * y).sum(1) - m2)
        zero = x.new_zeros(())
        per_index = torch.logaddexp(zero, lse_row - pos_logit) + torch.logaddexp(
            zero, lse_col - pos_logit
        )
        return _reduce(per_index, reduction)

    def _row_blocks(self) -> Iterator[tuple[int, int, int]]:
        """``(start, stop, flat offset)`` of every strip of the image rows' candidate blocks,
        in flat order: the in-batch block (``B`` wide), then the queue texts (``K`` wide)."""
        for start, stop in _strips(self.size, self.chunk):
            yield start, stop, start * self.size
        if self.queue_txt is not None:
            width = self.queue_txt.keys.shape[0]
            for start, stop in _strips(self.size, self.chunk):
                yield start, stop, self.size * self.size + start * width

    def _scores(self, start: int, stop: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores of rows ``start:stop`` in the block at ``offset`` and its *non*-negatives."""
        x = self.x[start:stop].detach()
        if offset < self.size * self.size:
            s = x @ self.y.detach().t()
            return s, _positives(self.codes, start, stop, self.size, s.device)
        return x @ self.queue_txt.keys.t(), ~self.queue_txt.allowed(start, stop)

    def row_negatives(self, row: int) -> np.ndarray:
        """The negatives of image row ``row`` (batch, then queue), float64 on the host."""
        parts = []
        for start, stop, offset in self._row_blocks():
            if start <= row < stop:
                s, other = self._scores(row, row + 1, offset)
                parts.append(s[0][~other[0]])
        return torch.cat(parts).double().cpu().numpy()

    @torch.no_grad()
    def anchor(
        self,
        *,
        selection: str = "median",
        top_k: int | None = None,
        min_variance: float = 1e-12,
        generator: torch.Generator | None = None,
        scale: float = 1.0,
        log_sigma_rows: torch.Tensor | None = None,
    ):
        """``adacl.adacl_anchor`` on this batch (same readings, guards and tie rule)."""
        from .adacl import AdaCLAnchor, _clone_region, _fit_values, _log_sum_exp

        size = self.size
        diag = (self.x.detach() * self.y.detach()).sum(1)
        total, n_neg = diag.new_zeros(size), diag.new_zeros(size)
        for start, stop, offset in self._row_blocks():  # pass 1: Eq. (7)
            s, other = self._scores(start, stop, offset)
            total[start:stop] += s.masked_fill_(other, 0).sum(1)
            n_neg[start:stop] += s.shape[1] - other.count_nonzero(1).to(s.dtype)
        salient = (diag - total / n_neg.clamp(min=1)).cpu().numpy()
        eligible = n_neg.cpu().numpy() >= 2
        if not eligible.any():
            return AdaCLAnchor(None, None, None, 0, None, None, None, "degenerate_variance")
        i_plus = int(np.where(eligible, salient, -np.inf).argmax())
        i_minus = int(np.where(eligible, salient, np.inf).argmin())
        fit = _fit_values(self.row_negatives(i_plus), self.row_negatives(i_minus), top_k)
        if not all(math.isfinite(v) and v > min_variance for v in (fit.var_clone, fit.var_salient)):
            return AdaCLAnchor(None, None, None, 0, i_plus, i_minus, fit, "degenerate_variance")
        region = _clone_region(fit)

        def clones(start: int, stop: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
            """Delta S of a strip and the mask of its clones (Eq. 10-11)."""
            s, excluded = self._scores(start, stop, offset)
            lo, hi, inside = region
            other = (s <= lo) | (s >= hi) if inside else (s >= lo) & (s <= hi)
            return (diag[start:stop, None] - s).abs_(), ~(other | excluded)

        cand = self.y.norm(dim=1).max()
        if self.queue_txt is not None and self.queue_txt.keys.shape[0]:
            cand = torch.maximum(cand, self.queue_txt.keys.norm(dim=1).max())
        width = 2.0 * float(self.x.norm(dim=1).max() * cand) / _DELTA_BINS
        width = width if width > 0 else 1.0
        counts: list[int] = []
        hist = torch.zeros(_DELTA_BINS, dtype=torch.long, device=diag.device)
        best: tuple[float, int] | None = None  # (delta, flat index) for "min" / "max"
        blocks = list(self._row_blocks())
        for start, stop, offset in blocks:  # pass 2: |S*|, histogram or extremes
            delta, clone = clones(start, stop, offset)
            counts.append(int(clone.count_nonzero()))
            if selection == "median":
                hist += _delta_bins(delta[clone], 0.0, width).bincount(minlength=_DELTA_BINS)
            elif selection in ("min", "max") and counts[-1]:
                low = selection == "min"
                fill = math.inf if low else -1.0
                flat = delta.masked_fill_(~clone, fill).flatten()
                index = int(flat.argmin() if low else flat.argmax())
                value = float(flat[index])
                if best is None or (value < best[0] if low else value > best[0]):
                    best = (value, offset + index)  # strict: an earlier strip keeps ties
        count = sum(counts)
        if count == 0:
            return AdaCLAnchor(None, None, None, 0, i_plus, i_minus, fit, "empty_clone_set")
        if selection == "median":
            pick = self._median_pick(clones, blocks, hist, (count + 1) // 2, width)
        elif selection in ("min", "max"):
            pick = best[1]
        else:
            if generator is None:
                r = int(torch.randint(count, ()))
            else:
                r = int(torch.randint(count, (), generator=generator, device=generator.device))
            before = 0
            for (start, stop, offset), n in zip(blocks, counts, strict=True):
                if r < before + n:
                    _, clone = clones(start, stop, offset)
                    pick = offset + int(clone.flatten().nonzero()[r - before, 0])
                    break
                before += n
        in_batch = size * size
        u = pick // size if pick < in_batch else (pick - in_batch) // self.queue_txt.keys.shape[0]
        if log_sigma_rows is None:
            log_sigma = _log_sum_exp(scale * self.row_negatives(u))
        else:
            log_sigma = float(log_sigma_rows[u])
        return AdaCLAnchor(float(diag[u]), log_sigma, u, count, i_plus, i_minus, fit, None)

    def _median_pick(self, clones, blocks, hist: torch.Tensor, k: int, width: float) -> int:
        """Flat index of the clone with the ``k``-th smallest delta (first among equals).

        Bin membership is always decided by the same ``_delta_bins`` formula (bin edges only
        preselect candidates from a band one bin wider on each side), so histogram counts and
        the collected clones agree.
        """
        levels: list[tuple[float, float, int]] = []  # (low, width, bin) of each refinement

        def member(delta: torch.Tensor, clone: torch.Tensor) -> torch.Tensor:
            """Flat indices of the strip's clones in the chosen bin of every level."""
            # The first level's bin widened by one bin on each side (unbounded at the clamped
            # ends) holds every member; the bin formula then decides on those candidates only
            # (no integer copy of the whole strip).
            low, w, b = levels[0]
            lo = -math.inf if b == 0 else low + (b - 1) * w
            hi = math.inf if b == _DELTA_BINS - 1 else low + (b + 2) * w
            keep = (clone & (delta >= lo) & (delta <= hi)).flatten().nonzero()[:, 0]
            flat = delta.flatten()
            for low, w, b in levels:
                keep = keep[_delta_bins(flat[keep], low, w) == b]
            return keep

        low = 0.0
        while True:
            cum = hist.cumsum(0)
            b = int(torch.searchsorted(cum, torch.tensor(k, device=cum.device)))
            k -= int(cum[b - 1]) if b else 0
            levels.append((low, width, b))
            if int(hist[b]) <= _BIN_CAP_PER_ROW * self.size or len(levels) == 3:
                break
            # Too many clones in one bin: a finer histogram of that bin (another pass).
            low, width = low + b * width, width / _DELTA_BINS
            hist = torch.zeros_like(hist)
            for start, stop, offset in blocks:
                delta, clone = clones(start, stop, offset)
                inside = delta.flatten()[member(delta, clone)]
                hist += _delta_bins(inside, low, width).bincount(minlength=_DELTA_BINS)
        values, flats = [], []
        for start, stop, offset in blocks:
            delta, clone = clones(start, stop, offset)
            keep = member(delta, clone)
            values.append(delta.flatten()[keep])
            flats.append(keep + offset)
        values, flats = torch.cat(values), torch.cat(flats)
        kth = values.kthvalue(k).values
        return int(flats[values == kth].min())


def _delta_bins(delta: torch.Tensor, low: float, width: float) -> torch.Tensor:
    return ((delta - low) / width).long().clamp_(0, _DELTA_BINS - 1)
