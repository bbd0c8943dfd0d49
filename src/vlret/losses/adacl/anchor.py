r"""AdaCL's anchor selection, Eq. (7)-(11) and Algorithm 1 steps 2-3, over tiles of scores.

One algorithm, written against a :class:`ScoreTiles` source: the image rows' candidate blocks
(the in-batch texts, then the memory-queue texts), read tile by tile. A similarity matrix in
memory (:class:`~vlret.losses.adacl.objective.DenseAdaCLBatch`) is the case of one tile per
block; embeddings streamed by the engine
(:class:`~vlret.losses.adacl.objective.TiledAdaCLBatch`) give tiles of ``chunk_size`` rows.

Passes over the tiles: Eq. (7) takes none (the source sums each row's negatives in float64:
by linearity for embeddings), the GDA reads the two chosen rows (Eq. 8-9); then (1) the clone
set S* (Eq. 10), its size and, per rule, the smallest or largest ``Delta S`` (Eq. 11), or for
the median the candidates: every clone when the blocks are single tiles, otherwise either the
clones of a ``Delta S`` band that holds the median (one pass, :mod:`.median`, the band set by
the first tile read) or a histogram of ``Delta S`` over ``[0, 2 max|s|]`` whose median bin
is refined by further histograms (each one more pass) while it holds more than 64 clones per
row; (2, streamed median without a band) the clones of the median's bin. The pick among equal
deltas is the first clone in flat order (each block row-major, the batch block before the queue
block).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .config import check_selection, check_temperature
from .gda import GDAFit, clone_region, fit_values
from .median import BandMedian, band_cap
from .objective import DenseAdaCLBatch

#: Bins of a ``Delta S`` histogram (the streamed median, Eq. 11).
_DELTA_BINS = 65536
#: A median bin holding more than this many clones per row is refined by another histogram.
_BIN_CAP_PER_ROW = 64


class ScoreTiles(Protocol):
    """A source of score tiles: image rows against one or more candidate blocks.

    Attributes:
        positives: ``(B,)`` the rows' positive scores ``s_ii`` (no gradient).
        tile: Tile height; a tile at least ``B`` high holds a whole block.
        widths: Width of each candidate block, in flat order.
    """

    # Read-only properties: a source may compute them.
    @property
    def positives(self) -> torch.Tensor: ...
    @property
    def tile(self) -> int: ...
    @property
    def widths(self) -> tuple[int, ...]: ...

    def scores(self, block: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scores of rows ``start:stop`` against block ``block`` (read only) and the bool mask
        of its entries that are not negatives (``None``: all are)."""

    def score_bound(self) -> float:
        """An upper bound of ``|s|`` over every block."""

    def negative_sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float64 ``(B,)`` sum and number of each row's negatives over every block (Eq. 7)."""


@dataclass(frozen=True)
class AdaCLAnchor:
    """Outcome of the anchor selection on one batch.

    Attributes:
        anchor: The anchor similarity ``s_uu``, or ``None`` when a guard fired.
        log_sigma_anchor: ``log Sigma_anchor`` (float64), or ``None``.
        row: The anchor row ``u``, or ``None``.
        clone_count: ``|S*|``.
        salient_row: The row of S_sln (highest salient score), if any.
        clone_row: The row of S_cln (lowest salient score), if any.
        fit: The GDA of Eq. (9), if fitted.
        guard: ``"degenerate_variance"`` or ``"empty_clone_set"`` when no anchor was found.
        delta: ``Delta S`` of the chosen clone (Eq. 11), if any.
    """

    anchor: float | None
    log_sigma_anchor: float | None
    row: int | None
    clone_count: int
    salient_row: int | None
    clone_row: int | None
    fit: GDAFit | None
    guard: str | None
    delta: float | None = None


def log_sum_exp(values: np.ndarray) -> float:
    """``log sum exp`` of a host array, shifted by its maximum."""
    top = values.max()
    return float(top + math.log(np.exp(values - top).sum()))


def row_negatives(source: ScoreTiles, row: int) -> np.ndarray:
    """The negatives of image row ``row`` (every block in order) as a float64 host array."""
    parts = []
    for block in range(len(source.widths)):
        s, excluded = source.scores(block, row, row + 1)
        parts.append(s[0] if excluded is None else s[0][~excluded[0]])
    return torch.cat(parts).double().cpu().numpy()


def _tiles(source: ScoreTiles) -> Iterator[tuple[int, int, int, int]]:
    """``(block, start, stop, flat offset)`` of every tile, in flat order."""
    size, base = source.positives.shape[0], 0
    for block, width in enumerate(source.widths):
        for start in range(0, size, source.tile):
            yield block, start, min(start + source.tile, size), base + start * width
        base += size * width


def _row_of(flat: int, size: int, widths: tuple[int, ...]) -> int:
    """The row of a flat index over the blocks."""
    for width in widths:
        if flat < size * width:
            return flat // width
        flat -= size * width
    raise AssertionError("flat index beyond the blocks")  # pragma: no cover


def _kth_smallest_index(values: torch.Tensor, k: int) -> int:
    """Index of the first entry equal to the ``k``-th smallest (1-based) of a 1-D tensor.

    On CPU numpy's introselect (``np.partition``) finds the value: ``torch.kthvalue`` is far
    slower there.
    """
    if values.device.type == "cpu":
        v = values.numpy()
        return int(np.argmax(v == np.partition(v, k - 1)[k - 1]))
    return int((values == values.kthvalue(k).values).byte().argmax())


def _as_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0 / 1 in ``dtype`` (through ``uint8``: several times faster on CPU)."""
    return mask.contiguous().view(torch.uint8).to(dtype)


def _delta_bins(delta: torch.Tensor, low: float, width: float) -> torch.Tensor:
    return ((delta - low) / width).long().clamp_(0, _DELTA_BINS - 1)


@torch.no_grad()
def select_anchor(
    source: ScoreTiles,
    *,
    selection: str = "median",
    top_k: int | None = None,
    min_variance: float = 1e-12,
    generator: torch.Generator | None = None,
    scale: float = 1.0,
    log_sigma_rows: torch.Tensor | None = None,
) -> AdaCLAnchor:
    """The anchor of Eq. (7)-(11) over a source of score tiles (readings: :func:`adacl_anchor`).

    Args:
        source: The batch's score tiles.
        selection: ``"median"``, ``"min"``, ``"max"`` or ``"random"`` (Table 5).
        top_k: Fit each GDA class on its ``top_k`` largest scores (A.10), or ``None``.
        min_variance: A class variance at or below this is degenerate.
        generator: The random rule's generator (``None``: the global RNG).
        scale: ``1 / negative_temperature``, the scale of ``Sigma_anchor``'s logits.
        log_sigma_rows: ``log Sigma`` of every row when the caller has it (with the same
            ``scale``); else the anchor row's is summed here in float64.

    Returns:
        The :class:`AdaCLAnchor`.
    """
    search = AnchorSearch(
        source, selection=selection, top_k=top_k, min_variance=min_variance, scale=scale
    )
    return search.finish(log_sigma_rows, generator)


class AnchorSearch:
    """:func:`select_anchor` in two steps, so that a pass over the tiles made anyway (the
    loss's forward) can serve the streamed median's band pass.

    Construction does everything before the clone pass: Eq. (7) (no pass), the GDA (Eq. 8-9)
    and the clone region; the streamed median's band pass (:class:`.median.BandMedian`) then
    sets its band from the first tile it reads.
    :meth:`visit` then takes the tiles of a block from the caller (the same scores
    ``source.scores`` gives), and :meth:`finish` passes over the rest and picks the anchor.
    Arguments as :func:`select_anchor`.
    """

    @torch.no_grad()
    def __init__(
        self,
        source: ScoreTiles,
        *,
        selection: str,
        top_k: int | None,
        min_variance: float,
        scale: float,
    ) -> None:
        self.source, self.selection, self.scale = source, selection, scale
        self.pos = pos = source.positives
        self.size = size = pos.shape[0]
        self.tiles = list(_tiles(source))
        self.visited: set[int] = set()  # blocks whose tiles the caller visited
        self.band: BandMedian | None = None
        self.decided: AdaCLAnchor | None = None  # a guard that fired before any pass
        self.i_plus = self.i_minus = None
        self.fit: GDAFit | None = None
        # Eq. (7) without a pass over the tiles: each row's negatives summed in float64.
        total, n_neg = source.negative_sums()
        salient = (pos.double() - total / n_neg.clamp(min=1)).cpu().numpy()
        eligible = n_neg.cpu().numpy() >= 2  # a variance needs two negatives
        if not eligible.any():
            self.decided = AdaCLAnchor(None, None, None, 0, None, None, None, "degenerate_variance")
            return
        i_plus = self.i_plus = int(np.where(eligible, salient, -np.inf).argmax())
        i_minus = self.i_minus = int(np.where(eligible, salient, np.inf).argmin())
        # Eq. (8)-(9): the GDA of the two rows' negatives, float64 on the host.
        fit = fit_values(row_negatives(source, i_plus), row_negatives(source, i_minus), top_k)
        self.fit = fit
        if not all(math.isfinite(v) and v > min_variance for v in (fit.var_clone, fit.var_salient)):
            self.decided = AdaCLAnchor(
                None, None, None, 0, i_plus, i_minus, fit, "degenerate_variance"
            )
            return
        self.region = clone_region(fit)
        self.streamed_median = selection == "median" and source.tile < size
        if self.streamed_median:
            entries = size * sum(source.widths)
            self.band = BandMedian(entries, band_cap(size, source.tile))
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def tile_clones(
        self, s: torch.Tensor, excluded: torch.Tensor | None, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``Delta S`` of a tile of rows from ``start`` and the mask of its entries that are
        *not* clones (Eq. 10-11: outside the clone region, or not a negative of the row)."""
        other = self.region.outside(s)
        if excluded is not None:
            other |= excluded
        return (self.pos[start : start + s.shape[0], None] - s).abs_(), other

    def clones(self, block: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`tile_clones` of the source's tile."""
        return self.tile_clones(*self.source.scores(block, start, stop), start)

    def _band_add(
        self, s: torch.Tensor, excluded: torch.Tensor | None, start: int, offset: int
    ) -> None:
        """:meth:`tile_clones` into reused buffers (a fresh tile-sized tensor costs page
        faults), added to the band pass."""
        assert self.band is not None  # the caller checked
        n = s.numel()
        if self._buffers is None or self._buffers[0].numel() < n:
            flag = torch.empty(n, dtype=torch.bool, device=s.device)
            self._buffers = (s.new_empty(n), flag, torch.empty_like(flag))
        delta, other, tmp = (b[:n].view(s.shape) for b in self._buffers)
        self.region.outside(s, other, tmp)
        if excluded is not None:
            other |= excluded
        torch.sub(self.pos[start : start + s.shape[0], None], s, out=delta).abs_()
        self.band.add(delta, other, offset)

    @property
    def wants_tiles(self) -> bool:
        """A band pass is pending: :meth:`visit` would save it a pass over a block."""
        return self.band is not None

    @torch.no_grad()
    def visit(self, block: int, start: int, s: torch.Tensor, excluded: torch.Tensor | None) -> None:
        """Tile ``s`` (rows from ``start``, read only) of ``block``, as ``source.scores``
        gives it; the caller visits every tile of the block once, then :meth:`finish`."""
        if self.band is None or self.band.failed:
            return  # no band pass, or one that gave up: finish makes the two passes
        self.visited.add(block)
        width, base = self.source.widths[block], self.size * sum(self.source.widths[:block])
        self._band_add(s, excluded, start, base + start * width)

    @torch.no_grad()
    def finish(
        self,
        log_sigma_rows: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> AdaCLAnchor:
        """The anchor (arguments as :func:`select_anchor`)."""
        if self.decided is not None:
            return self.decided
        band = self.band
        if band is not None:
            # One pass when the band holds the median (median.py); else the two passes below.
            for block, start, stop, offset in self.tiles:
                if band.failed:
                    break  # no band, or it overflowed: stop reading tiles
                if block not in self.visited:
                    self._band_add(*self.source.scores(block, start, stop), start, offset)
            if not band.failed:
                if band.count == 0:
                    return self._empty()
                pick, delta = band.result()
                if pick is not None:
                    assert delta is not None  # found with the pick
                    return self._found(pick, band.count, delta, log_sigma_rows)
        return self._passes(log_sigma_rows, generator)

    def _empty(self) -> AdaCLAnchor:
        return AdaCLAnchor(
            None, None, None, 0, self.i_plus, self.i_minus, self.fit, "empty_clone_set"
        )

    def _found(
        self, pick: int, count: int, delta: float, log_sigma_rows: torch.Tensor | None
    ) -> AdaCLAnchor:
        source = self.source
        u = _row_of(pick, self.size, source.widths)
        if log_sigma_rows is None:
            log_sigma = log_sum_exp(self.scale * row_negatives(source, u))
        else:
            log_sigma = float(log_sigma_rows[u])
        return AdaCLAnchor(
            float(self.pos[u]),
            log_sigma,
            u,
            count,
            self.i_plus,
            self.i_minus,
            self.fit,
            None,
            delta,
        )

    def _passes(
        self, log_sigma_rows: torch.Tensor | None, generator: torch.Generator | None
    ) -> AdaCLAnchor:
        """Pass over the tiles, Eq. (10)-(11): ``|S*|`` and, per rule, the extremes or the
        median's candidates (more passes: the streamed median's bin, the random rank)."""
        selection, clones, tiles = self.selection, self.clones, self.tiles
        # Non-clones are pushed past every delta by adding the dtype's largest value (deltas
        # are non-negative), so the smallest values, in flat order, are the clones'.
        big = torch.finfo(self.pos.dtype).max
        streamed_median = self.streamed_median
        if streamed_median:
            width = max(2.0 * self.source.score_bound() / _DELTA_BINS, 1e-30)
            hist = torch.zeros(_DELTA_BINS, dtype=torch.long, device=self.pos.device)
        counts: list[int] = []
        marked: list[torch.Tensor] = []  # in-memory median: every delta, non-clones pushed
        best: tuple[float, int] | None = None  # (delta, flat index) for "min" / "max"
        for block, start, stop, offset in tiles:
            delta, other = clones(block, start, stop)
            counts.append(other.numel() - int(other.count_nonzero()))
            if streamed_median:
                hist += _delta_bins(delta[~other], 0.0, width).bincount(minlength=_DELTA_BINS)
            elif selection == "median":
                marked.append(delta.add_(_as_float(other, delta.dtype), alpha=big).flatten())
            elif selection in ("min", "max") and counts[-1]:
                low = selection == "min"
                flat = delta.add_(_as_float(other, delta.dtype), alpha=big if low else -big)
                index = int(flat.argmin() if low else flat.argmax())
                value = float(flat.flatten()[index])
                if best is None or (value < best[0] if low else value > best[0]):
                    best = (value, offset + index)  # strict: an earlier tile keeps ties
        count = sum(counts)
        if count == 0:
            return self._empty()
        if selection == "median":
            k = (count + 1) // 2  # the lower median: an observed clone
            if streamed_median:
                members, k = _median_members(clones, tiles, hist, k, width, self.size)
                values, flats = (torch.cat(parts) for parts in zip(*members, strict=True))
                index = _kth_smallest_index(values, k)
                return self._found(int(flats[index]), count, float(values[index]), log_sigma_rows)
            every = marked[0] if len(marked) == 1 else torch.cat(marked)  # blocks in flat order
            pick = _kth_smallest_index(every, k)
            return self._found(pick, count, float(every[pick]), log_sigma_rows)
        if selection in ("min", "max"):
            assert best is not None  # count > 0: a tile with clones set it
            return self._found(best[1], count, best[0], log_sigma_rows)
        if generator is None:
            r = int(torch.randint(count, ()))
        else:
            r = int(torch.randint(count, (), generator=generator, device=generator.device))
        for (block, start, stop, offset), n in zip(tiles, counts, strict=True):
            if r < n:
                delta, other = clones(block, start, stop)
                index = int((~other).flatten().nonzero()[r, 0])
                return self._found(
                    offset + index, count, float(delta.flatten()[index]), log_sigma_rows
                )
            r -= n
        raise AssertionError("the random rank is below |S*|")  # pragma: no cover


def _median_members(
    clones: Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]],
    tiles: list[tuple[int, int, int, int]],
    hist: torch.Tensor,
    k: int,
    width: float,
    size: int,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The clones of the histogram bin holding the ``k``-th smallest ``Delta S``.

    The bin is refined by finer histograms of itself (one pass each, at most two) while it
    holds more than ``_BIN_CAP_PER_ROW`` clones per row. Bin membership is always decided by
    the same :func:`_delta_bins` formula (bin edges only preselect candidates from a band one
    bin wider on each side), so histogram counts and collected clones agree.

    Returns:
        ``(members, k)``: per tile, the members' deltas and flat indices; ``k`` the rank of the
        median among them.
    """
    levels: list[tuple[float, float, int]] = []  # (low, width, bin) of each level

    def member(delta: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """Flat indices of the tile's clones in the chosen bin of every level."""
        low, w, b = levels[0]
        lo = -math.inf if b == 0 else low + (b - 1) * w
        hi = math.inf if b == _DELTA_BINS - 1 else low + (b + 2) * w
        keep = (~other & (delta >= lo) & (delta <= hi)).flatten().nonzero()[:, 0]
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
        if int(hist[b]) <= _BIN_CAP_PER_ROW * size or len(levels) == 3:
            break
        low, width = low + b * width, width / _DELTA_BINS
        hist = torch.zeros_like(hist)
        for block, start, stop, _ in tiles:
            delta, other = clones(block, start, stop)
            inside = delta.flatten()[member(delta, other)]
            hist += _delta_bins(inside, low, width).bincount(minlength=_DELTA_BINS)
    members = []
    for block, start, stop, offset in tiles:
        delta, other = clones(block, start, stop)
        keep = member(delta, other)
        members.append((delta.flatten()[keep], keep + offset))
    return members, k


def adacl_anchor(
    sim: torch.Tensor,
    *,
    pos_mask: torch.Tensor | None = None,
    extra_neg_txt: torch.Tensor | None = None,
    extra_neg_txt_mask: torch.Tensor | None = None,
    selection: str = "median",
    top_k: int | None = None,
    min_variance: float = 1e-12,
    generator: torch.Generator | None = None,
    negative_temperature: float = 1.0,
) -> AdaCLAnchor:
    r"""Select the AdaCL anchor of a similarity matrix, Eq. (7)-(11), Algorithm 1 steps 2-3.

    :func:`select_anchor` on the matrix as one tile. Readings of the paper made here:

    * **Rows.** Each image row ``i`` with its positive ``s_ii`` and its negatives: the
      in-batch texts outside ``pos_mask`` plus the queue texts of ``extra_neg_txt`` allowed by
      ``extra_neg_txt_mask``. Rows, not columns, because Eq. (4) writes
      :math:`\Sigma_\mathrm{anchor}` over :math:`s(I_u, T_k)`, an image anchor. Queue images
      are negatives of text anchors and play no part.
    * **Eq. (7)** salient score :math:`s_{ii} - \frac{1}{M_i}\sum_j s_{ij}` over the row's
      ``M_i`` negatives; only rows with at least 2 negatives are eligible. S_sln = negatives of
      the row with the highest score (class C-bar), S_cln = those of the lowest (class C).
    * **Eq. (8)-(10)** the GDA of :func:`~vlret.losses.adacl.fit_gda` on the two rows; S* =
      every negative of every row with clone log-odds > 0, found through the roots of the
      log-odds quadratic (:func:`~vlret.losses.adacl.clone_region`).
    * **Eq. (11)** :math:`\Delta S = \{|s_{ii} - s| : s \in S^*\}` with ``s_ii`` the
      positive of the row of ``s``. ``"median"`` takes the lower median (rank
      ``ceil(|S*|/2)``, an observed clone), ``"min"`` / ``"max"`` the extremes, ``"random"``
      a uniform draw; among equal deltas the first clone in flat order (batch block row-major,
      then queue block).
    * **The anchor is the positive score** :math:`s_{uu}` of the row ``u`` of that clone, and
      :math:`\Sigma_\mathrm{anchor} = \sum_k e^{s_{uk}/t}` sums that row's negatives: Eq. (11)
      reads ":math:`anchor := s^{pos}`", Sec. 3.2 calls the anchor score :math:`s(I_u, T_u)`,
      and Eq. (4) puts the anchor in the positive slot of row ``u``. A.3's shorthand "the
      median of S*" is not consistent with those and is not followed.

    Args:
        sim: ``(B, B)`` similarities (no gradient is taken).
        pos_mask: Optional ``(B, B)`` bool further positives.
        extra_neg_txt: Optional ``(B, K)`` similarities to queue texts.
        extra_neg_txt_mask: Optional bool mask of the queue entries that are negatives.
        selection: ``"median"``, ``"min"``, ``"max"`` or ``"random"`` (Table 5).
        top_k: Fit each class on the ``top_k`` largest scores of its set (A.10), or ``None``.
        min_variance: A class variance ``<=`` this (or non-finite) is degenerate.
        generator: The random rule's generator (``None``: the global RNG).
        negative_temperature: ``t`` of ``Sigma_anchor`` (matching :func:`adacl_loss`); the
            salient scores, GDA, S* and the anchor use the raw similarities.

    Returns:
        The :class:`AdaCLAnchor`; ``guard="degenerate_variance"`` when no row has two
        negatives or a class variance is degenerate, ``"empty_clone_set"`` for an empty S*.

    Raises:
        ValueError: Bad inputs, naming the argument.
    """
    check_selection(selection, top_k, min_variance)
    scale = 1.0 / check_temperature(negative_temperature)
    extra = extra_neg_txt.detach() if isinstance(extra_neg_txt, torch.Tensor) else extra_neg_txt
    with torch.no_grad():
        batch = DenseAdaCLBatch(sim.detach(), pos_mask, extra, extra_neg_txt_mask)
    return select_anchor(
        batch,
        selection=selection,
        top_k=top_k,
        min_variance=min_variance,
        generator=generator,
        scale=scale,
    )
