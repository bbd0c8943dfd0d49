r"""The median of Eq. (11) in one pass over the score tiles, through a ``Delta S`` band.

The streamed median (:func:`~vlret.losses.adacl.select_anchor` on tiles smaller than the batch)
otherwise takes two passes once the clone region is known: a histogram of every clone's
``Delta S``, then the clones of the median's bin. Given a band ``[low, high]`` likely to hold
the median, one pass counts the clones, counts those with ``Delta S < low`` and collects the
``Delta S`` and flat index of those inside the band. When the lower median's rank
``k = ceil(|S*| / 2)`` falls among the collected clones it is found there exactly: the same
value, and among equal values the same (first in flat order) clone, as the two-pass search.
Otherwise (a band that missed, or one holding more than ``cap`` clones) :class:`BandMedian`
says so and the caller runs the two passes.

The band comes from the batch itself (:func:`sample_band`): the clones of ``SAMPLE_ROWS`` rows
in 8 evenly spaced runs, whose ``Delta S`` quantiles ``0.5 -+ BAND_QUANTILE`` bound it. The
previous batch's median is no such warm start: measured on independent batches
(benchmarks/bench_adacl.py), the two-row GDA moves the clone region, the clone count (a third
to two thirds of the entries) and with them the median ``Delta S`` by far more than a band's
width from one batch to the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

Clones = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]

#: Rows whose clones give the band (8 runs of 128 rows): about an eighth of a pass at B=8192.
SAMPLE_ROWS = 1024
#: Half-width of the band in quantiles of the sample's ``Delta S``: the sample median's error
#: measured on B=8192 batches (1024 rows) stayed within 0.02.
BAND_QUANTILE = 0.04


def band_cap(size: int, tile: int) -> int:
    """The most clones a band may collect: ``max(64 B, tile B / 4)`` ``(value, index)`` pairs,
    within the tiled path's ``O(tile x B)`` memory."""
    return max(64 * size, tile * size // 4)


class BandMedian:
    """One pass over the tiles: ``|S*|`` and the clones of a ``Delta S`` band (:meth:`add`
    each tile once, in any order), then the lower median's clone if the band holds it.

    Args:
        band: ``(low, high)``, the ``Delta S`` interval searched.
        cap: Give up collecting past this many clones in the band.
    """

    def __init__(self, band: tuple[float, float], cap: int) -> None:
        self.low, self.high = band
        self.cap = cap
        self.count = self.below = self.collected = 0
        self.values: list[torch.Tensor] = []
        self.flats: list[torch.Tensor] = []

    def add(self, delta: torch.Tensor, other: torch.Tensor, offset: int) -> None:
        """A tile: its ``Delta S``, the mask of its non-clones (overwritten) and the flat
        index of its first entry."""
        clone = other.logical_not_().flatten()  # (bool ops: cheaper than a masked fill)
        self.count += int(clone.count_nonzero())
        if self.collected > self.cap:
            return  # overflowed: only the count is still needed (the caller's fallback)
        flat = delta.flatten()
        under = (flat < self.low).logical_and_(clone)
        self.below += int(under.count_nonzero())
        keep = (flat <= self.high).logical_and_(clone).logical_xor_(under).nonzero()[:, 0]
        self.collected += len(keep)
        self.values.append(flat[keep])
        self.flats.append(keep + offset)

    def result(self) -> tuple[int | None, float | None]:
        """``(pick, delta)``: the flat index and ``Delta S`` of the lower median's clone (rank
        ``ceil(|S*| / 2)``; among equal values the smallest flat index), or ``(None, None)``
        when the band does not hold it, overflowed or ``S*`` is empty."""
        k = (self.count + 1) // 2 - self.below  # the rank among the collected clones
        if self.collected > self.cap or not 0 < k <= self.collected:
            return None, None
        v, f = torch.cat(self.values), torch.cat(self.flats)
        # On CPU numpy's introselect finds the value (torch.kthvalue is far slower there).
        if v.device.type == "cpu":
            value = v.new_tensor(np.partition(v.numpy(), k - 1)[k - 1])
        else:
            value = v.kthvalue(k).values
        return int(f[v == value].min()), float(value)


def sample_band(clones: Clones, blocks: int, size: int, cap: int) -> tuple[float, float] | None:
    """A ``Delta S`` band likely to hold the median, from the clones of a sample of rows.

    Args:
        clones: ``(block, start, stop) -> (Delta S, not-a-clone mask)`` of a tile.
        blocks: The number of candidate blocks.
        size: The batch size ``B``.
        cap: The most clones the band may be expected to hold.

    Returns:
        The sample's ``Delta S`` quantiles ``0.5 -+ BAND_QUANTILE``, or ``None`` when the sample
        has too few clones or the band would hold more than ``cap`` of the batch's.
    """
    runs, per_run = 8, SAMPLE_ROWS // 8
    if runs * per_run >= size:
        spans = [(0, size)]  # the whole batch
    else:  # runs start size / 8 >= per_run apart: no overlap
        spans = [(r * size // runs, r * size // runs + per_run) for r in range(runs)]
    parts = []
    for start, stop in spans:
        for block in range(blocks):
            delta, other = clones(block, start, stop)
            parts.append(delta[~other])
    rows = sum(stop - start for start, stop in spans)
    values = torch.cat(parts)
    n = len(values)
    if n < 64 or 2 * BAND_QUANTILE * n * size / rows > cap:
        return None
    ranks = [
        max(0, math.floor((0.5 - BAND_QUANTILE) * n)),
        min(n - 1, math.ceil((0.5 + BAND_QUANTILE) * n)),
    ]
    if values.device.type == "cpu":  # numpy's introselect: far faster than a sort
        low, high = np.partition(values.numpy(), ranks)[ranks]
    else:
        low, high = (values.kthvalue(r + 1).values for r in ranks)
    return float(low), float(high)
