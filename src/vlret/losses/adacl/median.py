r"""The median of Eq. (11) in one pass over the score tiles, warm-started by a ``Delta S`` band.

The streamed median (:func:`~vlret.losses.adacl.select_anchor` on tiles smaller than the batch)
otherwise takes two passes after the clone region is known: a histogram of every clone's
``Delta S``, then the clones of the median's bin. Given a band ``[low, high]`` expected to hold
the median (the previous batch's, :func:`next_band`), one pass counts the clones, counts those
with ``Delta S < low`` and collects the ``Delta S`` and flat index of those inside the band.
When the lower median's rank ``k = ceil(|S*| / 2)`` falls among the collected clones it is
found there exactly: the same value, and among equal values the same (first in flat order)
clone, as the two-pass search. Otherwise (a stale band, or one holding more than ``cap``
clones) :func:`band_median` says so and the caller runs the two passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

Clones = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]


def band_cap(size: int, tile: int) -> int:
    """The most clones a band may collect: ``max(64 B, tile B / 8)`` (a few strips' worth of
    ``(value, index)`` pairs, within the tiled path's ``O(tile x B)`` memory)."""
    return max(64 * size, tile * size // 8)


def band_median(
    clones: Clones,
    tiles: Iterable[tuple[int, int, int, int]],
    band: tuple[float, float],
    cap: int,
) -> tuple[int, int | None, float | None, float | None]:
    """One pass: ``|S*|`` and, when the band holds it, the lower median's clone.

    Args:
        clones: ``(block, start, stop) -> (Delta S, not-a-clone mask)`` of a tile.
        tiles: ``(block, start, stop, flat offset)`` of every tile.
        band: ``(low, high)``, the ``Delta S`` interval searched.
        cap: Give up collecting past this many clones in the band.

    Returns:
        ``(count, pick, delta, density)``: ``|S*|``, the flat index and ``Delta S`` of the
        median clone, and the band's clones per unit of ``Delta S``; the last three are
        ``None`` when the median is not in the band (or the band overflowed).
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
        return count, None, None, None
    v, f = torch.cat(values), torch.cat(flats)
    # The (k - below)-th smallest value; among equal values the smallest flat index. On CPU
    # numpy's introselect finds the value (torch.kthvalue is far slower there).
    if v.device.type == "cpu":
        value = v.new_tensor(np.partition(v.numpy(), k - below - 1)[k - below - 1])
    else:
        value = v.kthvalue(k - below).values
    pick = int(f[v == value].min())
    density = collected / max(high - low, 1e-30)
    return count, pick, float(value), density


def next_band(delta: float, density: float, cap: int) -> tuple[float, float]:
    """The band for the next batch: centred on this batch's median ``Delta S``, expected to
    hold a quarter of ``cap`` clones at this batch's density (room for drift on each side)."""
    half = cap / 8 / max(density, 1e-30)
    return max(delta - half, 0.0), delta + half
