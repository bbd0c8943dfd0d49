"""Identity-level retrieval metrics (text-based person search: CUHK-PEDES, ICFG-PEDES, RSTPReid).

A query (a caption describing a pedestrian) is scored against the whole gallery (every test
image); every gallery item of the query's person identity is relevant, so a query has several
correct answers. Reported, in percent, as IRRA reports them (anosorae/IRRA,
``utils/metrics.py``), under lower-case keys as every vlret metric (per direction ``r1`` ...
``minp``; a protocol's record ``identity_t2i_r1`` ... ``identity_i2t_minp``,
:mod:`vlret.metrics.keys`; the tables keep IRRA's labels R1 ... mINP):

* ``r1``, ``r5``, ``r10``: the fraction of queries with a relevant item in the top K;
* ``map``: the mean over queries of the average precision over the full ranking,
  ``AP = (1/R) sum_k k / pos_k`` with ``pos_k`` the 1-based position of the k-th relevant item
  and ``R`` the number of relevant items;
* ``minp`` (Ye et al., "Deep learning for person re-identification", TPAMI 2021): the mean over
  queries of ``R / pos_R``, the number of relevant items over the position of the LAST one
  (IRRA's ``tmp_cmc[last] / (last + 1)``).

**Ties count against the query** (the pessimistic count, as everywhere in
:mod:`vlret.metrics`): an irrelevant item scoring the same as a relevant one ranks ahead of it.
With the relevant items in descending score order, the k-th one sits at ``pos_k = k + c_k``,
``c_k`` the number of irrelevant items scoring ``>=`` it; the order of relevant items tied among
themselves changes no metric. IRRA sorts with ``torch.argsort``, whose order of tied scores is
unspecified; without ties both give the same numbers (the tests check it). A collapsed model
(all scores equal) thus scores at the bottom, never at the top.

Nothing is sorted along the gallery: for each query, each relevant item's ``c_k`` is counted
(``>=`` comparisons summed by a matrix-vector product, or, for queries with many relevant items,
a ``searchsorted`` of every score into the query's few relevant scores), in blocks of queries,
so the cost is a few passes over the score matrix, not a ``Q x G`` argsort.

:func:`identity_retrieval_metrics_from_embeddings` scores each block of queries from the
embeddings when it ranks it, so no full score matrix is held (ICFG-PEDES: 19,873 x 19,848).

This module is core: it imports torch, :mod:`vlret._checks`, :mod:`vlret.metrics.keys` and
:mod:`vlret.metrics.ranks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_finite
from .keys import IDENTITY_PREFIX
from .ranks import _check_chunk, _check_finite, _eval_dtype, check_not_empty

#: The keys of :func:`identity_retrieval_metrics`, in the order IRRA's table prints them.
IDENTITY_KEYS = ("r1", "r5", "r10", "map", "minp")
#: The table label of each key (IRRA's column headers).
IDENTITY_LABELS = {"r1": "R1", "r5": "R5", "r10": "R10", "map": "mAP", "minp": "mINP"}
#: The keys of :meth:`IdentityMetrics.as_dict` (a person-search record, the dev metrics of a
#: person-search run): ``identity_t2i_r1`` ... ``identity_i2t_minp``, text to image first.
IDENTITY_METRIC_KEYS = tuple(
    f"{IDENTITY_PREFIX}{d}_{k}" for d in ("t2i", "i2t") for k in IDENTITY_KEYS
)
#: The cut-offs of the recalls.
_KS = (1, 5, 10)
#: Scores per block of queries (a block is ``chunk_size`` queries, fewer on a wide gallery):
#: 4 MiB of float32, so that the passes over a block find it in cache. On one EPYC core, the
#: CUHK-PEDES-sized evaluation (bench_person_search.py) took 1.06x / 1.19x the matmul (t2i /
#: i2t) with such blocks, 1.39x / 1.53x with blocks of 2**25 scores.
_BLOCK_SCORES = 1 << 20
#: Up to this many relevant items in a block, one ``>=`` pass per relevant item (over the rows
#: that have that many); above it, a ``searchsorted`` of the block into the relevant scores
#: (log2 of them per score, but scalar: a pass of ``>=`` and a BLAS sum cost ~0.3 ns a score on
#: one EPYC core, ``searchsorted`` ~10 ns).
_COMPARE_MAX = 48
#: Counts of 0/1 summed in float32 are exact up to this many terms.
_FLOAT32_EXACT = 1 << 24


def _ids(x: Any, name: str, n: int, what: str, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        if isinstance(x, str) or not isinstance(x, Sequence | np.ndarray):
            raise ValueError(f"{name} must be a 1-D integer tensor, got {type(x).__name__}")
        x = torch.as_tensor(np.asarray(x))
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(
            f"{name} must be a 1-D integer tensor (the identity of each {what}), got shape "
            f"{tuple(x.shape)} dtype {x.dtype}"
        )
    if x.numel() != n:
        raise ValueError(f"{name} must have one id per {what} of sim ({n}), got {x.numel()}")
    return x.to(device=device, dtype=torch.long)


def _count_at_least(block: torch.Tensor, thr: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``(b, W)``: per row, the entries of ``block (b, G)`` scoring ``>= thr[row, k]``, for
    ``k < r[row]`` (``r`` ascending: threshold ``k`` is counted on the rows from the first with
    ``r > k`` on, so the cost is the sum of ``r``, not ``b x W``); other entries are 0."""
    b, g = block.shape
    w = thr.shape[1]
    if w <= _COMPARE_MAX:
        # 0/1 in a float buffer summed by a matrix-vector product (BLAS), as metrics.ranks does
        dtype = block.dtype if g <= _FLOAT32_EXACT else torch.float64
        hits = torch.empty(b, g, dtype=dtype, device=block.device)
        ones = torch.ones(g, dtype=dtype, device=block.device)
        out = torch.zeros(w, b, dtype=torch.long, device=block.device)
        # each threshold a contiguous (b, 1) column: a strided one made ge ~40x slower
        columns = thr.t().contiguous()
        firsts = torch.searchsorted(r, torch.arange(w, device=r.device), right=True).tolist()
        for k, a in enumerate(firsts):
            rows = hits[a:]
            torch.ge(block[a:], columns[k][a:, None], out=rows)
            out[k, a:] = torch.mv(rows, ones).to(torch.long)
        return out.t()
    # searchsorted: each score's number of thresholds <= it, then a histogram per row
    asc, order = thr.sort(dim=1)  # +inf (padding) last
    below = torch.searchsorted(asc.contiguous(), block, right=True)  # (b, G) in [0, W]
    hist = torch.zeros(b, w + 1, dtype=torch.long, device=block.device)
    hist.scatter_add_(1, below, torch.ones_like(below))
    at_least = hist.flip(1).cumsum(1).flip(1)[:, 1:]  # [k]: scores above the k-th threshold
    return torch.empty_like(at_least).scatter_(1, order, at_least)


def _block_sums(
    block: torch.Tensor, rel_index: torch.Tensor, r: torch.Tensor
) -> tuple[list[float], float, float]:
    """Hits at each K, and the sums of AP and INP, of the queries of ``block (b, G)`` whose
    relevant items are ``rel_index (b, W)`` (the first ``r`` of each row)."""
    b, w = rel_index.shape
    k = torch.arange(w, device=block.device)
    valid = k[None, :] < r[:, None]
    rel = block.gather(1, rel_index).masked_fill(~valid, float("-inf"))
    rel_desc = rel.sort(dim=1, descending=True).values  # padding (-inf) last
    thr = rel_desc.masked_fill(~valid, float("inf"))
    all_ge = _count_at_least(block, thr, r)
    # relevant items scoring >= each relevant score (the padding's -inf never does)
    if w <= _COMPARE_MAX:
        rel_ge = (rel_desc[:, None, :] >= thr[:, :, None]).sum(2)
    else:
        asc = rel_desc.flip(1).contiguous()
        rel_ge = w - torch.searchsorted(asc, thr.contiguous(), right=False)
    pos = (k[None, :] + 1 + all_ge - rel_ge).to(torch.float64)  # 1-based, ties against
    first = pos[:, 0]
    hits = [float((first <= cut).sum()) for cut in _KS]
    precision = ((k[None, :] + 1).to(torch.float64) / pos).masked_fill(~valid, 0.0)
    rf = r.to(torch.float64)
    ap = float((precision.sum(1) / rf).sum())
    inp = float((rf / pos.gather(1, (r - 1)[:, None]).squeeze(1)).sum())
    return hits, ap, inp


def _check_sim(sim: Any, name: str) -> None:
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2 or not sim.dtype.is_floating_point:
        got = f"shape {tuple(sim.shape)} dtype {sim.dtype}" if isinstance(sim, torch.Tensor) else ""
        raise ValueError(
            f"{name} must be a 2-D floating-point tensor, got {got or type(sim).__name__}"
        )


def _ranked(
    n_q: int, query_ids, gallery_ids, n_g: int, dev: torch.device, chunk_size: int, block_of
) -> dict[str, float]:
    """The metrics of ``n_q`` queries whose scores against the ``n_g`` gallery items
    ``block_of(idx)`` gives for a 1-D index of queries (a ``(len(idx), n_g)`` float tensor)."""
    q_ids = _ids(query_ids, "query_ids", n_q, "query (row)", dev)
    g_ids = _ids(gallery_ids, "gallery_ids", n_g, "gallery item (column)", dev)
    # the gallery grouped by id: item order[start[u] : start[u] + count[u]] has id uniq[u]
    order = torch.argsort(g_ids, stable=True)
    uniq, count = torch.unique_consecutive(g_ids[order], return_counts=True)
    start = torch.cumsum(count, 0) - count
    slot = torch.searchsorted(uniq, q_ids).clamp(max=len(uniq) - 1)
    missing = uniq[slot] != q_ids
    if bool(missing.any()):
        i = int(torch.nonzero(missing)[0])
        raise ValueError(
            f"query_ids[{i}] = {int(q_ids[i])}: no gallery item has this id (gallery_ids); "
            "every query needs at least one relevant gallery item"
        )
    r_all = count[slot]
    q_start = start[slot]
    rows = max(1, min(chunk_size, _BLOCK_SCORES // n_g))
    by_r = torch.argsort(r_all, stable=True)  # a block's width is close to each row's R
    hits = [0.0] * len(_KS)
    ap_sum = inp_sum = 0.0
    for a in range(0, n_q, rows):
        idx = by_r[a : a + rows]
        r = r_all[idx]
        k = torch.arange(int(r.max()), device=dev)
        offset = torch.minimum(k[None, :], (r - 1)[:, None])  # padding repeats the last one
        rel_index = order[q_start[idx][:, None] + offset]
        block_hits, ap, inp = _block_sums(block_of(idx), rel_index, r)
        hits = [h + bh for h, bh in zip(hits, block_hits, strict=True)]
        ap_sum += ap
        inp_sum += inp
    out = {f"r{cut}": 100.0 * h / n_q for cut, h in zip(_KS, hits, strict=True)}
    out["map"] = 100.0 * ap_sum / n_q
    out["minp"] = 100.0 * inp_sum / n_q
    return out


def identity_retrieval_metrics(
    sim: torch.Tensor, query_ids, gallery_ids, *, chunk_size: int = 1024
) -> dict[str, float]:
    """R@1, R@5, R@10, mAP and mINP (percent; keys :data:`IDENTITY_KEYS`) of ``sim``
    ``(queries, gallery)`` where a gallery item is relevant to a query when their ids are
    equal (text-to-image person search: ``sim`` captions x images, ``query_ids`` each
    caption's person, ``gallery_ids`` each image's; image-to-text: the transpose).

    Ties count against the query (module docstring). Queries are ranked ``chunk_size`` at a
    time (fewer when a block would exceed 2**20 scores), grouped by their number of relevant
    items; ``sim`` may be a non-contiguous view (``sim.t()``). Half-precision scores are ranked
    in float32. Every query needs at least one relevant gallery item: one without is a
    ``ValueError`` naming its index and id.
    """
    _check_chunk(chunk_size)
    _check_sim(sim, "sim")
    check_not_empty(sim, "sim", "query (row)", 0)
    check_not_empty(sim, "sim", "gallery item (column)", 1)
    n_q, n_g = sim.shape
    dtype = _eval_dtype(sim.dtype)
    _ids(query_ids, "query_ids", n_q, "query (row)", sim.device)  # shapes before the values
    _ids(gallery_ids, "gallery_ids", n_g, "gallery item (column)", sim.device)
    _check_finite(sim, "sim")
    return _ranked(
        n_q,
        query_ids,
        gallery_ids,
        n_g,
        sim.device,
        chunk_size,
        lambda idx: sim.index_select(0, idx).to(dtype),
    )


def identity_retrieval_metrics_from_embeddings(
    query_emb: torch.Tensor,
    gallery_emb: torch.Tensor,
    query_ids,
    gallery_ids,
    *,
    chunk_size: int = 1024,
) -> dict[str, float]:
    """:func:`identity_retrieval_metrics` of the dot products ``query_emb @ gallery_emb.T``
    (cosines when both are normalised), each block of queries scored when it is ranked: no
    ``(queries, gallery)`` matrix is held, at most ``chunk_size`` rows of it. Scores are
    computed in float32 at least (float64 embeddings in float64)."""
    _check_chunk(chunk_size)
    for name, t in (("query_emb", query_emb), ("gallery_emb", gallery_emb)):
        _check_sim(t, name)
        check_not_empty(t, name, "embedding", 0)
        check_finite(t, name)
    if query_emb.shape[1] != gallery_emb.shape[1] or query_emb.device != gallery_emb.device:
        raise ValueError(
            f"query_emb and gallery_emb must share their width and device, got "
            f"{tuple(query_emb.shape)} on {query_emb.device} and {tuple(gallery_emb.shape)} on "
            f"{gallery_emb.device}"
        )
    dtype = torch.promote_types(
        torch.promote_types(query_emb.dtype, gallery_emb.dtype), torch.float32
    )
    q, g = query_emb.to(dtype), gallery_emb.to(dtype)
    g_t = g.t()
    return _ranked(
        len(q),
        query_ids,
        gallery_ids,
        len(g),
        q.device,
        chunk_size,
        lambda idx: q.index_select(0, idx) @ g_t,
    )


@dataclass(frozen=True)
class IdentityMetrics:
    """Both directions of a person-search evaluation: text-to-image (caption queries, image
    gallery) and image-to-text (image queries, caption gallery), each a dict with the keys
    :data:`IDENTITY_KEYS` (percent)."""

    t2i: dict[str, float]
    i2t: dict[str, float]
    #: the persons of the evaluated split (the distinct ids of its images)
    identities: int = 0

    def as_dict(self) -> dict[str, float]:
        """``{"identity_t2i_r1": ..., "identity_i2t_minp": ...}``: the protocol's metric
        names (:data:`IDENTITY_METRIC_KEYS`)."""
        return {
            f"{IDENTITY_PREFIX}{d}_{k}": getattr(self, d)[k]
            for d in ("t2i", "i2t")
            for k in IDENTITY_KEYS
        }

    def __getitem__(self, key: str) -> float:
        return self.as_dict()[key]

    def format_table(self, title: str = "") -> str:
        """IRRA's table: one row per direction, R1 R5 R10 mAP mINP."""
        lines = [title] if title else []
        lines.append("task " + "".join(f"{IDENTITY_LABELS[k]:>8}" for k in IDENTITY_KEYS))
        for d in ("t2i", "i2t"):
            values = getattr(self, d)
            lines.append(f"{d:<5}" + "".join(f"{values[k]:8.2f}" for k in IDENTITY_KEYS))
        return "\n".join(lines)


__all__ = [
    "IDENTITY_KEYS",
    "IDENTITY_LABELS",
    "IDENTITY_METRIC_KEYS",
    "IdentityMetrics",
    "identity_retrieval_metrics",
    "identity_retrieval_metrics_from_embeddings",
]
