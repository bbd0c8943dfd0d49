"""Retrieval metrics with a full relevance matrix, beside the one-ground-truth ranks of
:mod:`vlret.metrics.ranks`.

``relevance`` is an ``(N_txt, N_img)`` boolean matrix: caption ``j`` is relevant to image ``i``
(every image a caption describes, not only its own). With it:

* **R-Precision** and **mAP@R** (Musgrave et al., "A metric learning reality check", 2020) in
  both directions: for a query with ``R`` relevant items, R-Precision is the fraction of the top
  ``R`` that are relevant, and mAP@R is ``(1/R) * sum_{k<=R} P@k * rel(k)``. Ties count against
  the query (irrelevant items tied with a relevant one rank first), as in
  :mod:`vlret.metrics.ranks`, so a collapsed model scores at the bottom, never at the top.
* the **ambiguity rate**: the fraction of standard negatives (a caption with another image) that
  are in fact relevant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .ranking import rank_blocks, rprecision_map_at_r_of
from .ranks import check_not_empty


@dataclass(frozen=True)
class ExtendedMetrics:
    """Relevance-aware metrics in percent (see the module docstring)."""

    t2i_rprecision: float
    t2i_map_at_r: float
    i2t_rprecision: float
    i2t_map_at_r: float
    #: Fraction (percent) of standard negatives that are relevant.
    ambiguity_rate: float
    #: Fraction (percent) of captions relevant to at least one image besides their own.
    ambiguous_captions: float
    #: Mean number of relevant images per caption (R of the t2i queries).
    mean_relevant_images: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def rprecision_map_at_r(
    scores: torch.Tensor, relevant: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query (row): ``(R-Precision, mAP@R, R)`` as fractions; rows with ``R = 0`` give 0.

    Ties are broken against the query (irrelevant items first). With the relevant items in
    descending score order, the i-th one (1-based) ranks at ``i + c_i``, ``c_i`` the number of
    irrelevant items scoring at least as high: the positions the ranking core counts
    (:func:`~vlret.metrics.rank_blocks`, no sort along the gallery), of which these are
    functions (:func:`~vlret.metrics.rprecision_map_at_r_of`).
    """
    if scores.shape != relevant.shape or scores.dim() != 2:
        raise ValueError(
            f"scores and relevant must be 2-D of one shape, got {tuple(scores.shape)} and "
            f"{tuple(relevant.shape)}"
        )
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores must be finite (got NaN or infinity)")
    relevant = relevant.to(torch.bool)
    r = relevant.sum(1)
    rp = torch.zeros(len(r), dtype=torch.float64, device=scores.device)
    ap = torch.zeros_like(rp)
    ranked = torch.nonzero(r > 0).squeeze(1)
    if ranked.numel():
        block = (0, scores.index_select(0, ranked), relevant.index_select(0, ranked))
        counted = rank_blocks([block], n_queries=int(ranked.numel()), every=True)
        rp_ranked, ap_ranked = rprecision_map_at_r_of(counted)
        rp[ranked], ap[ranked] = rp_ranked.to(rp.device), ap_ranked.to(ap.device)
    return rp, ap, r


def _as_matrix(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    return t


def _direction(
    queries: torch.Tensor, items: torch.Tensor, relevance: torch.Tensor, chunk_size: int
) -> tuple[float, float, float]:
    """Mean R-Precision, mAP@R (percent) and R over the queries (rows of ``relevance``) with at
    least one relevant item. Queries are processed in order of R, so that a chunk's ``topk``
    width is close to the R of each of its queries."""
    dtype = torch.promote_types(torch.promote_types(queries.dtype, items.dtype), torch.float32)
    q, it = queries.to(dtype), items.to(dtype)
    r_all = relevance.sum(1)
    order = torch.argsort(r_all, stable=True)
    order = order[r_all[order] > 0]
    if len(order) == 0:
        raise ValueError("relevance has no relevant pair")
    rp_sum = ap_sum = 0.0
    for start in range(0, len(order), chunk_size):
        idx = order[start : start + chunk_size]
        rp, ap, _ = rprecision_map_at_r(q[idx] @ it.t(), relevance[idx])
        rp_sum += float(rp.sum())
        ap_sum += float(ap.sum())
    n = len(order)
    return 100.0 * rp_sum / n, 100.0 * ap_sum / n, float(r_all[order].to(torch.float64).mean())


def ambiguity(relevance, txt_to_img) -> tuple[float, float]:
    """``(ambiguity rate, ambiguous captions)`` in percent: relevant standard negatives among
    all ``N_txt x (N_img - 1)`` of them, and captions with a relevant image besides their own."""
    rel = torch.as_tensor(relevance).to(torch.bool)
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long)
    n_txt, n_img = rel.shape
    if t2i.shape != (n_txt,):
        raise ValueError(f"txt_to_img must have shape ({n_txt},), got {tuple(t2i.shape)}")
    own = rel[torch.arange(n_txt), t2i]
    others = rel.sum(1) - own.to(torch.long)
    negatives = n_txt * (n_img - 1)
    rate = 100.0 * float(others.sum()) / negatives if negatives else 0.0
    return rate, 100.0 * float((others > 0).to(torch.float64).mean())


def extended_metrics(
    img_emb,
    txt_emb,
    relevance,
    *,
    txt_to_img=None,
    chunk_size: int = 512,
) -> ExtendedMetrics:
    """R-Precision and mAP@R both ways from embeddings (scores = dot products) and the
    ``(N_txt, N_img)`` boolean ``relevance``; with ``txt_to_img``, also the ambiguity rates
    (otherwise NaN). Memory is bounded by ``chunk_size x max(N_img, N_txt)`` scores."""
    img, txt = _as_matrix(img_emb, "img_emb"), _as_matrix(txt_emb, "txt_emb")
    check_not_empty(img, "img_emb", "image")
    check_not_empty(txt, "txt_emb", "text")
    rel = _as_matrix(relevance, "relevance").to(torch.bool)
    if rel.shape != (len(txt), len(img)):
        raise ValueError(
            f"relevance must have shape (N_txt, N_img) = ({len(txt)}, {len(img)}), got "
            f"{tuple(rel.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    t_rp, t_ap, t_r = _direction(txt, img, rel, chunk_size)
    i_rp, i_ap, _ = _direction(img, txt, rel.t(), chunk_size)
    if txt_to_img is not None:
        rate, amb = ambiguity(rel, txt_to_img)
    else:
        rate = amb = float("nan")
    return ExtendedMetrics(t_rp, t_ap, i_rp, i_ap, rate, amb, t_r)


__all__ = [
    "ExtendedMetrics",
    "ambiguity",
    "extended_metrics",
    "rprecision_map_at_r",
]
