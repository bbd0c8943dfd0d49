r"""The median of Eq. (11) in one pass over the score tiles, through a ``Delta S`` band.

The streamed median (:func:`~vlret.losses.adacl.select_anchor` on tiles smaller than the batch)
otherwise takes two passes once the clone region is known: a histogram of every clone's
``Delta S``, then the clones of the median's bin. Given a band ``[low, high]`` likely to hold
the median, one pass counts the clones, counts those with ``Delta S < low`` and collects the
``Delta S`` and flat index of those inside the band. When the lower median's rank
``k = ceil(|S*| / 2)`` falls among the collected clones it is found there exactly: the same
value, and among equal values the same (first in flat order) clone, as the two-pass search.
Otherwise (a band that missed, or one holding more than ``cap`` clones) :func:`band_median`
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
from collections.abc import Callable, Iterable

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


def band_median(
    clones: Clones,
    tiles: Iterable[tuple[int, int, int, int]],
    band: tuple[float, float],
    cap: int,
) -> tuple[int, int | None, float | None]:
    """One pass: ``|S*|`` and, when the band holds it, the lower median's clone.

    Args:
        clones: ``(block, start, stop) -> (Delta S, not-a-clone mask)`` of a tile.
        tiles: ``(block, start, stop, flat offset)`` of every tile.
        band: ``(low, high)``, the ``Delta S`` interval searched.
        cap: Give up collecting past this many clones in the band.

    Returns:
        ``(count, pick, delta)``: ``|S*|``, the flat index and ``Delta S`` of the median
        clone; the last two are ``None`` when the median is not in the band (or the band
        overflowed).
    """
    low, high = band
    count = below = collected = 0
    values: list[torch.Tensor] = []
    flats: list[torch.Tensor] = []
    for block, start, stop, offset in tiles:
        delta, other = clones(block, start, stop)
        # non-clones are pushed past every band (Delta S >= 0): one comparison per bound
        flat = delta.masked_fill_(other, math.inf).flatten()
        count += flat.numel() - int(other.count_nonzero())
        if collected > cap:
            continue  # overflowed: only the count is still needed (the caller's fallback)
        under = flat < low
        below += int(under.count_nonzero())
        keep = (flat <= high).logical_xor_(under).nonzero()[:, 0]
        collected += len(keep)
        values.append(flat[keep])
        flats.append(keep + offset)
    k = (count + 1) // 2
    if collected > cap or not below < k <= below + collected:
        return count, None, None
    v, f = torch.cat(values), torch.cat(flats)
    # The (k - below)-th smallest value; among equal values the smallest flat index. On CPU
    # numpy's introselect finds the value (torch.kthvalue is far slower there).
    if v.device.type == "cpu":
        value = v.new_tensor(np.partition(v.numpy(), k - below - 1)[k - below - 1])
    else:
        value = v.kthvalue(k - below).values
    pick = int(f[v == value].min())
    return count, pick, float(value)


def sample_band(
    clones: Clones, blocks: int, size: int, cap: int
) -> tuple[float, float] | None:
    """A ``Delta S`` band likely to hold the median, from the clones of a sample of rows.

    Args:
        clones: As :func:`band_median`.
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
    values = torch.cat(parts).sort().values
    n = len(values)
    if n < 64 or 2 * BAND_QUANTILE * n * size / rows > cap:
        return None
    low = values[max(0, math.floor((0.5 - BAND_QUANTILE) * n))]
    high = values[min(n - 1, math.ceil((0.5 + BAND_QUANTILE) * n))]
    return float(low), float(high)
