"""The ranking core: each query's rank counted from score blocks, under a relevance kind.

A scorer (two-tower embeddings, a pair model's or an ensemble's score matrix, a shortlist, a
re-scored matrix, zero-shot logits) yields **score blocks**: ``(row0, scores)`` with
``scores (b, G)`` the scores of queries ``row0 .. row0 + b - 1`` against the whole gallery, in
any order and of any size. :func:`rank_blocks` counts, for each query,

* ``first``: the 0-based rank of its best relevant item, i.e. the number of **non-relevant**
  gallery items scoring ``>=`` the best relevant score (**ties count against the query**: a
  non-relevant item tied with the relevant one ranks ahead of it, so a collapsed model whose
  scores are all equal ranks every query last, never first);
* with ``every=True``, ``positions``: the 1-based position of each of its relevant items in
  descending score order, ``pos_k = k + c_k`` (``c_k`` the non-relevant items scoring ``>=``
  the k-th relevant score; relevant items tied among themselves keep their count ``k``, which
  changes no metric).

Relevance is ``query_ids[q] == gallery_ids[g]`` (a :class:`~vlret.metrics.Relevance` gives the
ids of each of its directions: :func:`rank_queries`), or a block's own ``(b, G)`` boolean mask
(``(row0, scores, relevant)``: a shortlist, whose gallery differs per query). Nothing is sorted
along the gallery: a rank is a count of ``>=`` comparisons (summed by a BLAS matrix-vector
product), so the cost is a few passes over each block.

The metrics are functions of these counts: :func:`recall_at_k`, :func:`median_rank`,
:func:`mean_rank`, :func:`rsum` (the VSE protocol's), :func:`mean_average_precision` and
:func:`mean_inverse_negative_penalty` (person search), :func:`rprecision_map_at_r_of`
(R-Precision and mAP@R), :func:`accuracy_at_k` and :func:`mean_per_class_recall` (zero-shot
classification). :func:`block_rows` chooses a block's rows for the thread count.

This module is core: it imports torch, numpy, :mod:`vlret._checks` and
:mod:`vlret.metrics.relevance_kinds`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_finite
from .relevance_kinds import Relevance, get_relevance

#: Scores per block for one thread (4 MiB of float32: the passes over a block find it in
#: cache); :func:`block_rows` scales it by the thread count.
BLOCK_SCORES = 1 << 20
#: Up to this many relevant items in a block, one ``>=`` pass per relevant item; above it, a
#: ``searchsorted`` of the block into the relevant scores (scalar, ~30x slower a score).
_COMPARE_MAX = 48
#: Sums of 0/1 in float32 are exact up to this many terms.
_FLOAT32_EXACT = 1 << 24


def block_rows(n_columns: int, *, limit: int = 1024, threads: int | None = None) -> int:
    """Rows of a score block against ``n_columns`` gallery items: at most ``limit``, and at
    most :data:`BLOCK_SCORES` scores per thread (``threads``: default
    ``torch.get_num_threads()``). Each block costs a few parallel operations, each waiting for
    every worker thread; blocks that grow with the threads keep each thread's share of a block
    cache-sized while halving the waits per score."""
    n = torch.get_num_threads() if threads is None else threads
    return max(1, min(limit, (BLOCK_SCORES * max(1, n)) // max(1, n_columns)))


@dataclass(frozen=True)
class QueryRanks:
    """What :func:`rank_blocks` counted, per query."""

    #: ``(Q,)`` long: the 0-based rank of the best relevant item (ties against the query)
    first: torch.Tensor
    #: ``(Q,)`` long: the number of relevant gallery items ``R``
    relevant: torch.Tensor
    #: ``(Q, max R)`` long: the 1-based position of each relevant item, the best first
    #: (``every=True``; 0 beyond a query's ``R``), else ``None``
    positions: torch.Tensor | None = None


def _as_ids(x: Any, name: str, *, detail: str = "") -> torch.Tensor:
    """``x`` as a 1-D int64 tensor; ``ValueError`` naming ``name`` (and ``detail``, what the
    ids are) for anything else."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, str) or not isinstance(x, Sequence | np.ndarray):
            raise ValueError(f"{name} must be a 1-D integer tensor, got {type(x).__name__}")
        x = torch.as_tensor(np.asarray(x))
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(
            f"{name} must be a 1-D integer tensor{detail}, got shape {tuple(x.shape)} "
            f"dtype {x.dtype}"
        )
    return x.to(torch.long)


def _rank_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision scores change MSR-VTT R@1 by ~3 points; rank in float32 at least.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass
class _Gallery:
    """The gallery grouped by id: query ``q``'s relevant items are
    ``order[start[q] : start[q] + count[q]]``."""

    order: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor

    @classmethod
    def of(cls, query_ids: torch.Tensor, gallery_ids: torch.Tensor) -> _Gallery:
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


class _Scratch:
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
    scratch: _Scratch,
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
    scratch: _Scratch,
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
    block: torch.Tensor, relevant: torch.Tensor, every: bool, compare_max: int, scratch: _Scratch
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


def _check_finite(scores: torch.Tensor) -> None:
    # A row's sum is finite only if the row is (NaN and inf propagate), and BLAS sums rows
    # vectorised; an elementwise isfinite pass took a fifth of the COCO-5K matmul's time.
    if scores.numel() and not bool(
        torch.isfinite(torch.mv(scores, scores.new_ones(scores.shape[1]))).all()
    ):
        check_finite(scores, "scores")


def _check_block(scores: Any, row0: Any, n_queries: int, n_gallery: int | None) -> None:
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
def _one_thread() -> Iterator[None]:
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


def _count_slice(
    block: torch.Tensor,
    mask: torch.Tensor | None,
    gallery: _Gallery | None,
    row0: int,
    every: bool,
    compare_max: int,
    scratch: _Scratch,
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


def rank_blocks(
    blocks: Iterable[tuple[int, torch.Tensor] | tuple[int, torch.Tensor, torch.Tensor]],
    *,
    n_queries: int,
    query_ids: Any = None,
    gallery_ids: Any = None,
    every: bool = False,
    compare_max: int = _COMPARE_MAX,
) -> QueryRanks:
    """Each query's rank counted from score blocks (module docstring).

    Args:
        blocks: ``(row0, scores)`` with ``scores (b, G)`` the finite scores of queries
            ``row0 .. row0 + b - 1`` against every gallery item, or ``(row0, scores,
            relevant)`` with a ``(b, G)`` boolean mask of the relevant pairs. Together they
            cover each query exactly once, in any order. Half-precision scores are ranked in
            float32.
        n_queries: The number of queries ``Q``.
        query_ids: ``(Q,)`` integer ids; gallery item ``g`` is relevant to query ``q`` when
            ``query_ids[q] == gallery_ids[g]`` (blocks without a mask).
        gallery_ids: ``(G,)`` integer ids.
        every: Also count the position of every relevant item (mAP, mINP, R-Precision, mAP@R).
        compare_max: Up to this many relevant items in a block, one ``>=`` pass per relevant
            item; above it, a ``searchsorted`` of the block into its relevant scores (the same
            counts; a pass of ``>=`` and a BLAS sum cost ~0.3 ns a score on one EPYC core,
            ``searchsorted`` ~10 ns).

    Returns:
        The :class:`QueryRanks`.

    Raises:
        ValueError: Malformed or non-finite blocks, blocks that do not cover each query once,
            ids of the wrong shape, or a query without a relevant gallery item (its index and
            id named).
    """
    if isinstance(n_queries, bool) or not isinstance(n_queries, int) or n_queries < 1:
        raise ValueError(f"n_queries must be a positive integer, got {n_queries!r}")
    q_ids = None if query_ids is None else _as_ids(query_ids, "query_ids")
    g_ids = None if gallery_ids is None else _as_ids(gallery_ids, "gallery_ids")
    if (q_ids is None) != (g_ids is None):
        raise ValueError("query_ids and gallery_ids go together (or neither, with block masks)")
    if q_ids is not None and q_ids.numel() != n_queries:
        raise ValueError(f"query_ids must have one id per query ({n_queries}), got {q_ids.numel()}")
    n_gallery = None if g_ids is None else g_ids.numel()
    gallery: _Gallery | None = None
    first = torch.full((n_queries,), -1, dtype=torch.long)
    relevant = torch.zeros(n_queries, dtype=torch.long)
    found: list[tuple[int, torch.Tensor]] = []
    scratch = _Scratch()
    for item in blocks:
        row0, scores = item[0], item[1]
        mask = item[2] if len(item) > 2 else None
        _check_block(scores, row0, n_queries, n_gallery)
        b = scores.shape[0]
        if b == 0:
            continue
        if bool((first[row0 : row0 + b] >= 0).any()):
            raise ValueError(f"a score block's rows {row0}:{row0 + b} were ranked already")
        dev = scores.device
        block = scores.to(_rank_dtype(scores.dtype))
        _check_finite(block)
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.shape != scores.shape:
                raise ValueError("a score block's relevance mask must have the block's shape")
            mask = mask.to(device=dev, dtype=torch.bool)
        elif q_ids is None or g_ids is None:
            raise ValueError("a block without a relevance mask needs query_ids/gallery_ids")
        elif gallery is None or gallery.order.device != dev:
            gallery = _Gallery.of(q_ids.to(dev), g_ids.to(dev))
        # counted in cache-sized slices of rows, in one thread: each of the few operations a
        # slice costs would otherwise wait for every worker thread (on a loaded machine, for a
        # descheduled one), while the scorer's matmul of a whole block keeps them all busy
        step = max(1, BLOCK_SCORES // max(1, block.shape[1])) if dev.type == "cpu" else b
        parts = []
        with _one_thread():
            for s0 in range(0, b, step):
                part = block[s0 : s0 + step]
                part_mask = None if mask is None else mask[s0 : s0 + step]
                part_gallery = None if mask is not None else gallery
                parts.append(
                    _count_slice(
                        part, part_mask, part_gallery, row0 + s0, every, compare_max, scratch
                    )
                )
        width = max(p.shape[1] for p, _ in parts)
        pos = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p, _ in parts])
        r = torch.cat([r for _, r in parts])
        pos = pos.cpu()
        first[row0 : row0 + b] = pos[:, 0] - 1
        relevant[row0 : row0 + b] = r
        if every:
            found.append((row0, pos))
    if bool((first < 0).any()):
        missing = int(torch.nonzero(first < 0)[0])
        raise ValueError(f"no score block ranked query {missing} (of {n_queries})")
    positions = None
    if every:
        positions = torch.zeros(n_queries, int(relevant.max()), dtype=torch.long)
        for row0, pos in found:
            positions[row0 : row0 + pos.shape[0], : pos.shape[1]] = pos
    return QueryRanks(first, relevant, positions)


def matrix_blocks(
    scores: torch.Tensor, *, rows: int | None = None
) -> Iterable[tuple[int, torch.Tensor]]:
    """The row blocks ``(row0, scores[row0 : row0 + rows])`` of a score matrix (``rows``:
    default :func:`block_rows` of its width); a view such as ``sim.t()`` is copied one block at
    a time."""
    step = block_rows(scores.shape[1]) if rows is None else rows
    for a in range(0, scores.shape[0], step):
        block = scores[a : a + step]
        yield a, block if block.is_contiguous() else block.contiguous()


def rank_queries(
    blocks: Iterable[tuple[int, torch.Tensor]],
    relevance: str | Relevance,
    labels: Mapping[str, Any],
    *,
    direction: str,
    n_queries: int,
    every: bool = False,
) -> QueryRanks:
    """:func:`rank_blocks` of ``direction`` under ``relevance`` (a registered name or a
    :class:`~vlret.metrics.Relevance`): the blocks' rows are that direction's queries, their
    columns its gallery, and the ids come from ``relevance.ids(direction, labels)``."""
    kind = get_relevance(relevance)
    query_ids, gallery_ids = kind.ids(direction, labels)
    return rank_blocks(
        blocks, n_queries=n_queries, query_ids=query_ids, gallery_ids=gallery_ids, every=every
    )


# --- metrics as functions of the counts -------------------------------------------------------


def _ranks_array(first: Any, name: str) -> np.ndarray:
    r = np.asarray(torch.as_tensor(first).cpu(), dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array")
    return r


def recall_at_k(first: Any, k: int) -> float:
    """``R@K``: 100 x the fraction of queries whose best relevant item ranks ``< k``
    (0-based ``first`` ranks)."""
    return 100.0 * float(np.mean(_ranks_array(first, "ranks") < k))


def median_rank(first: Any) -> float:
    """``medr``: floor of the median 0-based rank, plus 1."""
    return float(np.floor(np.median(_ranks_array(first, "ranks"))) + 1)


def mean_rank(first: Any) -> float:
    """``meanr``: the mean 0-based rank plus 1."""
    return float(_ranks_array(first, "ranks").mean() + 1)


def rsum(recalls: Mapping[str, float], keys: Sequence[str]) -> float:
    """``rsum``: the sum of the recalls named by ``keys`` (the VSE protocol: the six
    ``i2t_r1`` ... ``t2i_r10``)."""
    return sum(recalls[k] for k in keys)


def _per_query_precisions(
    ranks: QueryRanks, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k / pos_k masked, R, pos)`` as float64 for ``rows``, ``W`` = their largest R."""
    if ranks.positions is None:
        raise ValueError("ranks: the positions of every relevant item are needed (every=True)")
    r = ranks.relevant[rows]
    w = int(r.max())
    pos = ranks.positions[rows, :w].to(torch.float64)
    k = torch.arange(w)
    valid = k[None, :] < r[:, None]
    precision = ((k[None, :] + 1).to(torch.float64) / pos).masked_fill(~valid, 0.0)
    return precision, r.to(torch.float64), pos


def _by_relevant(ranks: QueryRanks, group: int) -> tuple[torch.Tensor, int]:
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a positive integer, got {group!r}")
    return torch.argsort(ranks.relevant, stable=True), group


def mean_average_precision(ranks: QueryRanks, *, group: int = 1024) -> float:
    """mAP (percent): the mean over queries of ``AP = (1/R) sum_k k / pos_k``. Queries are
    summed in order of ``R``, ``group`` at a time (the order person search always summed
    them in: its numbers stay the same to the last bit)."""
    order, group = _by_relevant(ranks, group)
    total = 0.0
    for a in range(0, order.numel(), group):
        precision, rf, _ = _per_query_precisions(ranks, order[a : a + group])
        total += float((precision.sum(1) / rf).sum())
    return 100.0 * total / order.numel()


def mean_inverse_negative_penalty(ranks: QueryRanks, *, group: int = 1024) -> float:
    """mINP (percent): the mean over queries of ``R / pos_R``, the relevant items over the
    position of the last one (Ye et al., TPAMI 2021); summed as :func:`mean_average_precision`."""
    order, group = _by_relevant(ranks, group)
    total = 0.0
    for a in range(0, order.numel(), group):
        _, rf, pos = _per_query_precisions(ranks, order[a : a + group])
        r = ranks.relevant[order[a : a + group]]
        total += float((rf / pos.gather(1, (r - 1)[:, None]).squeeze(1)).sum())
    return 100.0 * total / order.numel()


def rprecision_map_at_r_of(ranks: QueryRanks) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query, ``(R-Precision, mAP@R)`` as float64 fractions (Musgrave et al., 2020): the
    fraction of the top ``R`` that is relevant, and ``(1/R) sum_{k: pos_k <= R} k / pos_k``."""
    if ranks.positions is None:
        raise ValueError("ranks: the positions of every relevant item are needed (every=True)")
    w = ranks.positions.shape[1]
    i = torch.arange(1, w + 1, dtype=torch.float64)
    rank = ranks.positions.to(torch.float64)
    limit = ranks.relevant[:, None].to(torch.float64)
    hits = ((i <= limit) & (rank <= limit) & (rank > 0)).to(torch.float64)
    denom = ranks.relevant.clamp(min=1).to(torch.float64)
    rp = hits.sum(1) / denom
    ap = (hits * i / rank.clamp(min=1)).sum(1) / denom
    return rp, ap


def accuracy_at_k(first: Any, k: int) -> float:
    """Zero-shot top-``k`` accuracy as a fraction: images whose class ranks ``< k``."""
    return float((torch.as_tensor(first) < k).to(torch.float64).mean())


def mean_per_class_recall(first: Any, labels: Any, n_classes: int) -> float:
    """Balanced accuracy: the top-1 accuracy of each class's images, averaged over the classes
    present in ``labels`` (scikit-learn's ``balanced_accuracy_score``)."""
    ranks = torch.as_tensor(first)
    target = torch.as_tensor(labels, dtype=torch.long, device=ranks.device)
    top1 = (ranks < 1).to(torch.float64)
    per_class_hits = torch.zeros(n_classes, dtype=torch.float64, device=ranks.device)
    per_class_hits.index_add_(0, target, top1)
    counts = torch.bincount(target, minlength=n_classes).to(torch.float64)
    present = counts > 0
    return float((per_class_hits[present] / counts[present]).mean())


__all__ = [
    "BLOCK_SCORES",
    "QueryRanks",
    "accuracy_at_k",
    "block_rows",
    "matrix_blocks",
    "mean_average_precision",
    "mean_inverse_negative_penalty",
    "mean_per_class_recall",
    "mean_rank",
    "median_rank",
    "rank_blocks",
    "rank_queries",
    "recall_at_k",
    "rprecision_map_at_r_of",
    "rsum",
]
