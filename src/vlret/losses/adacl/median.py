r"""The median of Eq. (11) in one pass over the score tiles, through a ``Delta S`` band.

The streamed median (:func:`~vlret.losses.adacl.select_anchor` on tiles smaller than the batch)
otherwise takes two passes once the clone region is known: a histogram of every clone's
``Delta S``, then the clones of the median's bin. :class:`BandMedian` takes one: the first tile
it reads sets a band ``[low, high]`` likely to hold the median (:func:`choose_band`: that
tile's ``Delta S`` quantiles ``0.5 -+ BAND_QUANTILE``, narrowed to the collection cap); every
tile then adds its number of clones, its number of clones with ``Delta S < low``, and the
``Delta S`` and flat index of its clones inside the band. When the lower median's rank
``k = ceil(|S*| / 2)`` falls among the collected clones it is found there exactly: the same
value, and among equal values the same (first in flat order) clone, as the two-pass search.
Otherwise (a band that missed, one holding more than ``cap`` clones, or no band)
:meth:`BandMedian.result` says so and the caller runs the two passes: the band decides the
cost, never the anchor.

The band comes from the batch itself. The previous batch's median is no warm start: measured
on independent B=8192 batches, the two-row GDA moves the clone region, the clone count (a
third to two thirds of the entries) and with them the median ``Delta S`` (0.04, 0.09, 0.06,
...) by far more than a band's width from one batch to the next. A tile of rows is a sample of
the batch (the rows of a shuffled batch are independent draws; an unshuffled one may cost the
two passes, never the anchor).
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: Half-width of the band in quantiles of the first tile's ``Delta S``: on eight independent
#: B=8192 batches (tiles of 2048 rows) the first tile's median sat within 0.007 of the batch's.
BAND_QUANTILE = 0.04
#: At most this many entries of the first tile (a column stride) give the band's quantiles.
_SAMPLE_ENTRIES = 1 << 20
#: A band needs at least this many sampled clones.
_MIN_SAMPLE = 64


def band_cap(size: int, tile: int) -> int:
    """The most clones a band may collect: ``max(64 B, tile B / 4)`` ``(value, index)`` pairs,
    within the tiled path's ``O(tile x B)`` memory."""
    return max(64 * size, tile * size // 4)


def _quantiles(values: torch.Tensor, ranks: list[int]) -> list[float]:
    """The values of the given 0-based ranks (introselect on CPU: far faster than a sort)."""
    if values.device.type == "cpu":
        return [float(v) for v in np.partition(values.numpy(), ranks)[ranks]]
    return [float(values.kthvalue(r + 1).values) for r in ranks]


def choose_band(
    delta: torch.Tensor, clone: torch.Tensor, entries: int, cap: int
) -> tuple[float, float] | None:
    """A ``Delta S`` band likely to hold the batch's median, from one tile.

    Args:
        delta: The tile's ``Delta S``.
        clone: The tile's clone mask.
        entries: The number of entries of every block (``B`` times the widths' sum).
        cap: The most clones the band may be expected to hold.

    Returns:
        The tile's ``Delta S`` quantiles ``0.5 -+ q`` (over every ``ceil(numel / 2^20)``-th
        column) with ``q = BAND_QUANTILE``, narrowed so that the band is expected to hold at
        most 90% of ``cap`` of the batch's clones; ``None`` when the tile has too few clones or
        ``q`` would fall below a quarter of ``BAND_QUANTILE``.
    """
    stride = max(1, math.ceil(delta.numel() / _SAMPLE_ENTRIES))
    values = delta[:, ::stride][clone[:, ::stride]]
    n = len(values)
    share = n / delta[:, ::stride].numel()  # the tile's clone rate, extrapolated
    q = min(BAND_QUANTILE, 0.9 * cap / max(2 * share * entries, 1.0))
    if n < _MIN_SAMPLE or q < BAND_QUANTILE / 4:
        return None
    low_rank = max(0, math.floor((0.5 - q) * n))
    high_rank = min(n - 1, math.ceil((0.5 + q) * n))
    low, high = _quantiles(values, [low_rank, high_rank])
    return low, high


class BandMedian:
    """One pass over the tiles: ``|S*|`` and the clones of a ``Delta S`` band (:meth:`add`
    each tile once, in any order; the first sets the band), then the lower median's clone if
    the band holds it.

    Args:
        entries: The number of entries of every block (``B`` times the widths' sum).
        cap: Give up collecting past this many clones in the band.
    """

    def __init__(self, entries: int, cap: int) -> None:
        self.entries, self.cap = entries, cap
        self.band: tuple[float, float] | None = None
        self.failed = False  # no band, or the band overflowed
        self.count = self.below = self.collected = 0
        self.values: list[torch.Tensor] = []
        self.flats: list[torch.Tensor] = []
        self._masks: tuple[torch.Tensor, torch.Tensor] | None = None  # reused bool buffers

    def add(self, delta: torch.Tensor, other: torch.Tensor, offset: int) -> None:
        """A tile: its ``Delta S`` (read), the mask of its non-clones (overwritten) and the
        flat index of its first entry."""
        clone = other.logical_not_()  # (bool ops: cheaper than a masked fill of the deltas)
        self.count += int(clone.count_nonzero())
        if self.failed:
            return  # only the count is still needed (the caller's fallback)
        if self.band is None:
            self.band = choose_band(delta, clone, self.entries, self.cap)
            if self.band is None:
                self.failed = True
                return
        low, high = self.band
        under, keep = self._buffers(clone)
        flat, clone = delta.flatten(), clone.flatten()
        torch.lt(flat, low, out=under).logical_and_(clone)
        self.below += int(under.count_nonzero())
        torch.le(flat, high, out=keep).logical_and_(clone).logical_xor_(under)
        index = keep.nonzero()[:, 0]
        self.collected += len(index)
        if self.collected > self.cap:
            self.failed, self.values, self.flats = True, [], []
            return
        self.values.append(flat[index])
        self.flats.append(index + offset)

    def _buffers(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two flat bool buffers of ``like``'s size (a fresh large tensor costs page faults)."""
        n = like.numel()
        if self._masks is None or self._masks[0].numel() < n:
            self._masks = (like.new_empty(n), like.new_empty(n))
        return self._masks[0][:n], self._masks[1][:n]

    def result(self) -> tuple[int | None, float | None]:
        """``(pick, delta)``: the flat index and ``Delta S`` of the lower median's clone (rank
        ``ceil(|S*| / 2)``; among equal values the smallest flat index), or ``(None, None)``
        when the band does not hold it, overflowed, was not set or ``S*`` is empty."""
        k = (self.count + 1) // 2 - self.below  # the rank among the collected clones
        if self.failed or not 0 < k <= self.collected:
            return None, None
        v, f = torch.cat(self.values), torch.cat(self.flats)
        value = v.new_tensor(_quantiles(v, [k - 1])[0])
        return int(f[v == value].min()), float(value)
