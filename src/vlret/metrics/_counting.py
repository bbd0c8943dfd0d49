"""The counting inside :func:`vlret.metrics.ranking.rank_blocks`: each query's relevant
scores gathered from its gallery ids or its block's mask, the non-relevant items scoring
``>=`` each of them counted in cache-sized slices of a block (a ``>=`` pass summed by a BLAS
matrix-vector product, or a ``searchsorted`` above ``compare_max`` relevant items), and the
slices shared among the CPU's threads. Every count is an integer: how the slices are cut or
which thread counts one changes no rank."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_finite

#: Sums of 0/1 in float32 are exact up to this many terms.
_FLOAT32_EXACT = 1 << 24


def rank_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision scores change MSR-VTT R@1 by ~3 points; rank in float32 at least.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass
class Gallery:
    """The gallery grouped by id: query ``q``'s relevant items are
    ``order[start[q] : start[q] + count[q]]``."""

    order: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor

    @classmethod
    def of(cls, query_ids: torch.Tensor, gallery_ids: torch.Tensor) -> Gallery:
        order = torch.argsort(gallery_ids, stable=True)
        uniq, count = torch.unique_consecutive(gallery_ids[order], return_counts=True)
        start = torch.cumsum(count, 0) - count
        if uniq.numel() == 0:
            raise ValueError("gallery_ids is empty: the gallery needs at least one item")
        slot = torch.searchsorted(uniq, query_ids).clamp(max=len(uniq) - 1)
        missing = uniq[slot] != query_ids
        if bool(missing.any()):
            i = int(torch.nonzero(missing)[0])
            raise ValueError(
                f"query_ids[{i}] = {int(query_ids[i])}: no gallery item has this id "
                "(gallery_ids); every query needs at least one relevant gallery item"
            )
        return cls(order, start[slot], count[slot])

    def relevant_index(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """``(len(rows), width)`` gallery indices of each row's relevant items; a row with
        fewer repeats its last one (so a max or a gather over the padding is harmless)."""
        r = self.count[rows]
        k = torch.arange(width, device=rows.device)
        offset = torch.minimum(k[None, :], (r - 1)[:, None])
        return self.order[self.start[rows][:, None] + offset]


class Scratch:
    """A 0/1 buffer and a vector of ones, reused across the blocks of one ranking (a fresh
    ``(b, G)`` buffer a block cost its page faults every time)."""

    def __init__(self) -> None:
        self.hits: torch.Tensor | None = None
        self.ones: torch.Tensor | None = None

    def get(
        self, rows: int, cols: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A ``(rows, cols)`` buffer and ``cols`` ones of ``dtype`` on ``device``."""
        hits, ones = self.hits, self.ones
        if (
            hits is None
            or ones is None
            or hits.dtype != dtype
            or hits.device != device
            or hits.numel() < rows * cols
            or ones.numel() < cols
        ):
            hits = torch.empty(rows * cols, dtype=dtype, device=device)
            ones = torch.ones(cols, dtype=dtype, device=device)
            self.hits, self.ones = hits, ones
        return hits[: rows * cols].view(rows, cols), ones[:cols]


def _count_rows_at_least(
    block: torch.Tensor,
    thr: torch.Tensor,
    r: torch.Tensor,
    sorted_r: bool,
    compare_max: int,
    scratch: Scratch,
) -> torch.Tensor:
    """``(b, W)``: per row, the entries of ``block (b, G)`` scoring ``>= thr[row, k]`` for
    ``k < r[row]`` (0 elsewhere). With ``sorted_r`` (``r`` ascending), threshold ``k`` is
    counted only on the rows from the first with ``r > k`` on: the cost is the sum of ``r``."""
    b, g = block.shape
    w = thr.shape[1]
    if w <= compare_max:
        # 0/1 in a float buffer summed by a matrix-vector product: BLAS is vectorised on every
        # CPU, where a bool mask summed to int64 was ~6x slower
        dtype = block.dtype if g <= _FLOAT32_EXACT else torch.float64
        hits, ones = scratch.get(b, g, dtype, block.device)
        out = torch.zeros(w, b, dtype=torch.long, device=block.device)
        # each threshold a contiguous (b, 1) column: a strided one made ge ~40x slower
        columns = thr.t().contiguous()
        if sorted_r:
            firsts = torch.searchsorted(r, torch.arange(w, device=r.device), right=True).tolist()
        else:
            firsts = [0] * w
        for k, a in enumerate(firsts):
            rows = hits[a:]
            torch.ge(block[a:], columns[k][a:, None], out=rows)
            out[k, a:] = torch.mv(rows, ones).to(torch.long)
        return out.t()
    # searchsorted: each score's number of thresholds <= it, then a histogram per row
    asc, order = thr.sort(dim=1)  # +inf (padding) last
    below = torch.searchsorted(asc.contiguous(), block.contiguous(), right=True)
    hist = torch.zeros(b, w + 1, dtype=torch.long, device=block.device)
    hist.scatter_add_(1, below, torch.ones_like(below))
    at_least = hist.flip(1).cumsum(1).flip(1)[:, 1:]  # [k]: scores above the k-th threshold
    return torch.empty_like(at_least).scatter_(1, order, at_least)


def _block_positions(
    block: torch.Tensor,
    rel_index: torch.Tensor,
    r: torch.Tensor,
    every: bool,
    compare_max: int,
    scratch: Scratch,
) -> torch.Tensor:
    """``(b, W)`` 1-based positions of each row's relevant items (``every``), or ``(b, 1)``
    the position of the best one; ``block``'s rows sorted by ``r`` ascending when ``every``."""
    w = rel_index.shape[1]
    k = torch.arange(w, device=block.device)
    valid = k[None, :] < r[:, None]
    rel = block.gather(1, rel_index).masked_fill(~valid, float("-inf"))
    if not every:
        best = rel.amax(dim=1, keepdim=True)
        all_ge = _count_rows_at_least(block, best, torch.ones_like(r), False, compare_max, scratch)
        rel_ge = (rel >= best).sum(1, keepdim=True)
        return 1 + all_ge - rel_ge
    rel_desc = rel.sort(dim=1, descending=True).values  # padding (-inf) last
    thr = rel_desc.masked_fill(~valid, float("inf"))
    all_ge = _count_rows_at_least(block, thr, r, True, compare_max, scratch)
    # relevant items scoring >= each relevant score (the padding's -inf never does)
    if w <= compare_max:
        rel_ge = (rel_desc[:, None, :] >= thr[:, :, None]).sum(2)
    else:
        asc = rel_desc.flip(1).contiguous()
        rel_ge = w - torch.searchsorted(asc, thr.contiguous(), right=False)
    return (k[None, :] + 1 + all_ge - rel_ge).masked_fill(~valid, 0)


def _masked_positions(
    block: torch.Tensor, relevant: torch.Tensor, every: bool, compare_max: int, scratch: Scratch
) -> torch.Tensor:
    """As :func:`_block_positions` for a block with its own ``(b, G)`` relevance mask."""
    r = relevant.sum(1)
    if bool((r == 0).any()):
        row = int(torch.nonzero(r == 0)[0])
        raise ValueError(f"query {row} of the block has no relevant gallery item")
    if not every:
        best = block.masked_fill(~relevant, float("-inf")).amax(dim=1, keepdim=True)
        return 1 + ((block >= best) & ~relevant).sum(1, keepdim=True)
    # each row's relevant columns first (a top-w of the mask, no sort along the gallery; their
    # order changes no position), padded by the last one
    w = int(r.max())
    index = relevant.to(block.dtype).topk(w, dim=1).indices
    k = torch.arange(w, device=block.device)
    last = index.gather(1, (r - 1)[:, None])
    index = torch.where(k[None, :] < r[:, None], index, last)
    by_r = torch.argsort(r, stable=True)
    pos = _block_positions(block[by_r], index[by_r], r[by_r], True, compare_max, scratch)
    return torch.empty_like(pos).index_copy_(0, by_r, pos)


def check_finite_scores(scores: torch.Tensor) -> None:
    # A row's sum is finite only if the row is (NaN and inf propagate), and BLAS sums rows
    # vectorised; an elementwise isfinite pass took a fifth of the COCO-5K matmul's time.
    if scores.numel() and not bool(
        torch.isfinite(torch.mv(scores, scores.new_ones(scores.shape[1]))).all()
    ):
        check_finite(scores, "scores")


def check_block(scores: Any, row0: Any, n_queries: int, n_gallery: int | None) -> None:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(f"a score block must be a 2-D (rows, gallery) tensor, got {scores!r:.60}")
    if not scores.dtype.is_floating_point:
        raise ValueError(f"a score block must be floating-point, got {scores.dtype}")
    if isinstance(row0, bool) or not isinstance(row0, int) or row0 < 0:
        raise ValueError(f"a score block's row offset must be an int >= 0, got {row0!r}")
    if row0 + scores.shape[0] > n_queries:
        raise ValueError(
            f"a score block's rows {row0}:{row0 + scores.shape[0]} exceed the {n_queries} queries"
        )
    if n_gallery is not None and scores.shape[1] != n_gallery:
        raise ValueError(
            f"a score block must cover the whole gallery ({n_gallery} items), got "
            f"{scores.shape[1]} columns"
        )


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch's operations in one thread inside the block (the thread count restored after)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def count_slice(
    block: torch.Tensor,
    mask: torch.Tensor | None,
    gallery: Gallery | None,
    row0: int,
    every: bool,
    compare_max: int,
    scratch: Scratch,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions (b, W), R (b,))`` on the CPU of the rows ``row0 ..`` of ``block``, under
    ``mask`` or the ``gallery``'s ids."""
    b = block.shape[0]
    if mask is not None:
        pos = _masked_positions(block, mask, every, compare_max, scratch)
        return pos.cpu(), mask.sum(1).cpu()
    assert gallery is not None
    rows = torch.arange(row0, row0 + b, device=block.device)
    r_dev = gallery.count[rows]
    width = int(r_dev.max())
    if every and b > 1 and not bool((r_dev[1:] >= r_dev[:-1]).all()):
        by_r = torch.argsort(r_dev, stable=True)
        index = gallery.relevant_index(rows[by_r], width)
        ordered = block.index_select(0, by_r)
        pos = _block_positions(ordered, index, r_dev[by_r], True, compare_max, scratch)
        pos = torch.empty_like(pos).index_copy_(0, by_r, pos)
    else:  # rows already in order of R (identity.py orders its queries so), or the best only
        index = gallery.relevant_index(rows, width)
        pos = _block_positions(block, index, r_dev, every, compare_max, scratch)
    return pos.cpu(), r_dev.cpu()


def count_workers(device: torch.device) -> int:
    """Threads that count a block's slices: torch's thread count on the CPU (each slice in one
    thread, the slices shared), one elsewhere (a device counts a block in one call)."""
    return torch.get_num_threads() if device.type == "cpu" else 1


def count_in_threads(
    count: Any, starts: range, workers: int, buffers: list[Scratch]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count(start, buffer)`` of every slice start, ``workers`` slices at a time on a pool of
    Python threads (each with its own scratch buffer), in the order of ``starts``. The counts
    are integers: the result does not depend on which thread counted which slice."""
    while len(buffers) < workers:
        buffers.append(Scratch())
    chunks = [list(starts[w::workers]) for w in range(workers)]

    def run(w: int) -> list[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
        return [(s0, count(s0, buffers[w])) for s0 in chunks[w]]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = [item for result in pool.map(run, range(workers)) for item in result]
    return [part for _, part in sorted(done, key=lambda item: item[0])]


def count_part(
    s0: int,
    buffer: Scratch,
    *,
    block: torch.Tensor,
    mask: torch.Tensor | None,
    gallery: Gallery | None,
    row0: int,
    step: int,
    every: bool,
    compare_max: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`count_slice` of the slice of ``block`` starting at row ``s0`` (``step`` rows)."""
    part_mask = None if mask is None else mask[s0 : s0 + step]
    part = block[s0 : s0 + step]
    return count_slice(part, part_mask, gallery, row0 + s0, every, compare_max, buffer)


def count_slices(
    count: Any,
    starts: range,
    device: torch.device,
    scratch: Scratch,
    buffers: list[Scratch],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count(start, buffer)`` of every slice start, in order: each slice in one thread, the
    slices shared among torch's threads on the CPU (``scratch`` serves one thread; ``buffers``
    one per pooled thread, kept across blocks)."""
    workers = min(len(starts), count_workers(device))
    with one_thread():
        if workers <= 1:
            return [count(s0, scratch) for s0 in starts]
        return count_in_threads(count, starts, workers, buffers)
