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

Nothing is sorted along the gallery: the ranking core (:mod:`vlret.metrics.ranking`) counts
each relevant item's ``c_k`` in blocks of queries (``>=`` comparisons summed by a
matrix-vector product), so the cost is a few passes over the score matrix, not a ``Q x G``
argsort; mAP and mINP are its functions of those positions.

:func:`identity_retrieval_metrics_from_embeddings` scores each block of queries from the
embeddings when it ranks it, so no full score matrix is held (ICFG-PEDES: 19,873 x 19,848).

This module is core: it imports torch, :mod:`vlret._checks`, :mod:`vlret.metrics.keys`,
:mod:`vlret.metrics.ranking` and :mod:`vlret.metrics.ranks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .keys import IDENTITY_KEYS, IDENTITY_PREFIX
from .ranking import (
    _as_ids,
    _Gallery,
    block_rows,
    mean_average_precision,
    mean_inverse_negative_penalty,
    rank_blocks,
)
from .ranks import _check_chunk, _check_finite, _eval_dtype, check_not_empty

#: The table label of each key (IRRA's column headers).
IDENTITY_LABELS = {"r1": "R1", "r5": "R5", "r10": "R10", "map": "mAP", "minp": "mINP"}
#: The cut-offs of the recalls.
_KS = (1, 5, 10)
#: mAP and mINP sum the queries' values in order of R, ``chunk_size`` at a time, fewer when
#: that many rows would exceed this many scores: the order they were always summed in, so the
#: numbers stay the same to the last bit whatever blocks the scores were ranked in.
_SUM_GROUP_SCORES = 1 << 20
#: the ranking core's ``compare_max`` (:func:`~vlret.metrics.ranking.rank_blocks`)
_COMPARE_MAX = 48


def _ids(x: Any, name: str, n: int, what: str, device: torch.device) -> torch.Tensor:
    ids = _as_ids(x, name, detail=f" (the identity of each {what})")
    if ids.numel() != n:
        raise ValueError(f"{name} must have one id per {what} of sim ({n}), got {ids.numel()}")
    return ids.to(device=device)


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
    ``block_of(idx)`` gives for a 1-D index of queries (a ``(len(idx), n_g)`` float tensor),
    counted by the ranking core (:func:`~vlret.metrics.ranking.rank_blocks`)."""
    q_ids = _ids(query_ids, "query_ids", n_q, "query (row)", dev)
    g_ids = _ids(gallery_ids, "gallery_ids", n_g, "gallery item (column)", dev)
    r_all = _Gallery.of(q_ids, g_ids).count
    # the queries in order of R, so that a block's width is close to each of its rows' R
    by_r = torch.argsort(r_all, stable=True)
    rows = block_rows(n_g, limit=chunk_size)
    blocks = ((a, block_of(by_r[a : a + rows])) for a in range(0, n_q, rows))
    ranks = rank_blocks(
        blocks,
        n_queries=n_q,
        query_ids=q_ids[by_r],
        gallery_ids=g_ids,
        every=True,
        compare_max=_COMPARE_MAX,
    )
    out = {f"r{cut}": 100.0 * float((ranks.first < cut).sum()) / n_q for cut in _KS}
    group = max(1, min(chunk_size, _SUM_GROUP_SCORES // n_g))
    out["map"] = mean_average_precision(ranks, group=group)
    out["minp"] = mean_inverse_negative_penalty(ranks, group=group)
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
        _check_finite(t, name)  # a row sum per row first: an isfinite pass cost 5% of the run
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
    "IDENTITY_LABELS",
    "IdentityMetrics",
    "identity_retrieval_metrics",
    "identity_retrieval_metrics_from_embeddings",
]
