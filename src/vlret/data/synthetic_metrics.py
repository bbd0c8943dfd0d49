"""Exhaustive relevance of the synthetic world and the metrics that use it.

A caption is relevant to an image when every fact it states is a fact of the image. That gives
the full ``(N_txt, N_img)`` relevance matrix, beside the one-ground-truth labels of the standard
protocol, and with it:

* **R-Precision** and **mAP@R** (Musgrave et al., "A metric learning reality check", 2020) in
  both directions: for a query with ``R`` relevant items, R-Precision is the fraction of the top
  ``R`` that are relevant, and mAP@R is ``(1/R) * sum_{k<=R} P@k * rel(k)``. Ties count against
  the query (irrelevant items tied with a relevant one rank first), as in
  :mod:`vlret.metrics`, so a collapsed model scores at the bottom, never at the top.
* the **clone forced choice**: a caption chooses between its image and a clone sibling that it
  does not describe (t2i), and an image between its caption and the sibling's caption made from
  the same plan (i2t); a tie scores one half, so chance is 50.
* the **ambiguity rate**: the fraction of standard negatives (a caption with another image) that
  are in fact relevant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .synthetic_language import N_FACTS


@dataclass(frozen=True)
class FactSets:
    """Sets of fact ids in CSR layout: set ``k`` is ``indices[indptr[k]:indptr[k + 1]]``."""

    indptr: np.ndarray
    indices: np.ndarray

    @classmethod
    def from_lists(cls, sets: Sequence[Sequence[int]]) -> FactSets:
        lengths = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = [int(f) for s in sets for f in s]
        return cls(indptr, np.asarray(flat, dtype=np.int32))

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def __getitem__(self, k: int) -> np.ndarray:
        return self.indices[self.indptr[k] : self.indptr[k + 1]]

    def take(self, rows: Sequence[int] | np.ndarray) -> FactSets:
        """The sets of ``rows``, in that order."""
        return FactSets.from_lists([self[int(r)] for r in rows])

    def dense(self, n_facts: int = N_FACTS) -> np.ndarray:
        """``(len, n_facts)`` boolean indicator matrix."""
        out = np.zeros((len(self), n_facts), dtype=bool)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        out[rows, self.indices] = True
        return out

    def padded(self, fill: int) -> np.ndarray:
        """``(len, max set size)`` ids, short rows padded with ``fill``."""
        lengths = np.diff(self.indptr)
        width = int(lengths.max()) if len(lengths) else 0
        out = np.full((len(self), max(width, 1)), fill, dtype=np.int64)
        cols = np.arange(len(self.indices)) - np.repeat(self.indptr[:-1], lengths)
        out[np.repeat(np.arange(len(self)), lengths), cols] = self.indices
        return out


def _as_factsets(x: FactSets | Sequence[Sequence[int]]) -> FactSets:
    return x if isinstance(x, FactSets) else FactSets.from_lists(x)


# ------------------------------------------------------------------------------ relevance


def iter_relevance(
    caption_facts: FactSets | Sequence[Sequence[int]],
    image_facts: FactSets | Sequence[Sequence[int]],
    *,
    n_facts: int = N_FACTS,
    chunk_size: int = 4096,
) -> Iterator[tuple[int, np.ndarray]]:
    """Blocks ``(first caption, (B, N_img) bool)`` of the relevance matrix, ``B <= chunk_size``.

    Each fact's image set is a packed bit row; a caption's row is the AND of the rows of its
    facts, so the cost is ``N_txt x facts per caption x N_img / 8`` byte operations.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    caps, imgs = _as_factsets(caption_facts), _as_factsets(image_facts)
    n_img = len(imgs)
    packed = np.packbits(imgs.dense(n_facts).T, axis=1)
    # An extra all-ones row for padding (a caption is a set of any size).
    packed = np.vstack([packed, np.full((1, packed.shape[1]), 255, dtype=np.uint8)])
    for start in range(0, len(caps), chunk_size):
        stop = min(start + chunk_size, len(caps))
        lo, hi = caps.indptr[start], caps.indptr[stop]
        ids = FactSets(caps.indptr[start : stop + 1] - lo, caps.indices[lo:hi])
        block = np.bitwise_and.reduce(packed[ids.padded(fill=n_facts)], axis=1)
        yield start, np.unpackbits(block, axis=1, count=n_img).astype(bool)


def relevance_matrix(
    caption_facts: FactSets | Sequence[Sequence[int]],
    image_facts: FactSets | Sequence[Sequence[int]],
    *,
    n_facts: int = N_FACTS,
    chunk_size: int = 4096,
) -> np.ndarray:
    """Dense ``(N_txt, N_img)`` boolean relevance (caption facts subset of image facts).

    COCO-like 5K is 25000 x 5000 = 125 MB; for training splits use :func:`iter_relevance` or
    :func:`relevance_pairs`.
    """
    caps, imgs = _as_factsets(caption_facts), _as_factsets(image_facts)
    out = np.zeros((len(caps), len(imgs)), dtype=bool)
    for start, block in iter_relevance(caps, imgs, n_facts=n_facts, chunk_size=chunk_size):
        out[start : start + len(block)] = block
    return out


def relevance_pairs(
    caption_facts: FactSets | Sequence[Sequence[int]],
    image_facts: FactSets | Sequence[Sequence[int]],
    *,
    n_facts: int = N_FACTS,
    chunk_size: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """The relevant pairs as ``(caption indices, image indices)`` (int32, row-major order)."""
    txt, img = [], []
    for start, block in iter_relevance(
        caption_facts, image_facts, n_facts=n_facts, chunk_size=chunk_size
    ):
        r, c = np.nonzero(block)
        txt.append((r + start).astype(np.int32))
        img.append(c.astype(np.int32))
    if not txt:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(txt), np.concatenate(img)


def pairs_to_matrix(txt: np.ndarray, img: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Dense boolean matrix from :func:`relevance_pairs` output."""
    out = np.zeros(shape, dtype=bool)
    out[np.asarray(txt, dtype=np.int64), np.asarray(img, dtype=np.int64)] = True
    return out


def fact_oracle_embeddings(
    image_facts: FactSets | Sequence[Sequence[int]],
    caption_facts: FactSets | Sequence[Sequence[int]],
    *,
    n_facts: int = N_FACTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings of an encoder that sees the facts: ``img . txt = |c & i| - |c|``, which is 0
    exactly for relevant pairs and negative otherwise (an upper bound on any encoder)."""
    imgs, caps = _as_factsets(image_facts), _as_factsets(caption_facts)
    img = np.concatenate([imgs.dense(n_facts), np.ones((len(imgs), 1))], axis=1)
    sizes = np.diff(caps.indptr)[:, None]
    txt = np.concatenate([caps.dense(n_facts), -sizes], axis=1)
    return torch.from_numpy(img.astype(np.float32)), torch.from_numpy(txt.astype(np.float32))


# ------------------------------------------------------------------------------ metrics


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
    irrelevant items scoring at least as high; only ranks up to ``R`` matter, so ``c_i`` is
    counted among the top ``max R`` irrelevant scores (``topk``, no full sort).
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
    width = max(int(r.max()) if r.numel() else 0, 1)
    width = min(width, scores.shape[1])
    rel_top = scores.masked_fill(~relevant, float("-inf")).topk(width, dim=1).values
    irr_top = scores.masked_fill(relevant, float("-inf")).topk(width, dim=1).values
    # irrelevant scores >= each relevant score (-inf padding is never >= a finite score)
    ascending = irr_top.flip(1).contiguous()
    at_least = width - torch.searchsorted(ascending, rel_top.contiguous(), right=False)
    i = torch.arange(1, width + 1, device=scores.device, dtype=torch.float64)
    rank = i + at_least.to(torch.float64)
    limit = r[:, None].to(torch.float64)
    hits = ((i <= limit) & (rank <= limit)).to(torch.float64)
    denom = r.clamp(min=1).to(torch.float64)
    rp = hits.sum(1) / denom
    ap = (hits * i / rank).sum(1) / denom
    return rp, ap, r


def _as_tensor(x, name: str) -> torch.Tensor:
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
    img, txt = _as_tensor(img_emb, "img_emb"), _as_tensor(txt_emb, "txt_emb")
    rel = _as_tensor(relevance, "relevance").to(torch.bool)
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


# ------------------------------------------------------------------------------ clones


@dataclass(frozen=True)
class CloneChoice:
    """Clone forced-choice accuracy in percent (ties count one half; chance is 50)."""

    t2i: float
    i2t: float
    t2i_trials: int
    i2t_trials: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def clone_trials(
    *,
    txt_to_img,
    groups,
    caption_facts: FactSets | Sequence[Sequence[int]],
    image_facts: FactSets | Sequence[Sequence[int]],
) -> tuple[np.ndarray, np.ndarray]:
    """Forced-choice trials among clone siblings.

    Returns ``t2i`` rows ``(caption, own image, sibling)`` where the caption does not describe
    the sibling, and ``i2t`` rows ``(image, own caption, sibling caption)`` pairing the k-th
    captions of two siblings, where the sibling's caption does not describe the image.
    """
    caps, imgs = _as_factsets(caption_facts), _as_factsets(image_facts)
    t2i_of = np.asarray(torch.as_tensor(txt_to_img), dtype=np.int64)
    grp = np.asarray(groups, dtype=np.int64)
    by_img: dict[int, list[int]] = {}
    for j, i in enumerate(t2i_of.tolist()):
        by_img.setdefault(i, []).append(j)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(grp.tolist()):
        members.setdefault(g, []).append(i)
    img_sets = {}
    t2i_rows, i2t_rows = [], []
    for group in members.values():
        if len(group) < 2:
            continue
        for i in group:
            img_sets.setdefault(i, set(imgs[i].tolist()))
        for i in group:
            for i2 in group:
                if i2 == i:
                    continue
                own, other = by_img.get(i, []), by_img.get(i2, [])
                for j in own:
                    if not set(caps[j].tolist()) <= img_sets[i2]:
                        t2i_rows.append((j, i, i2))
                for j, j2 in zip(own, other, strict=False):
                    if not set(caps[j2].tolist()) <= img_sets[i]:
                        i2t_rows.append((i, j, j2))
    return (
        np.asarray(t2i_rows, dtype=np.int64).reshape(-1, 3),
        np.asarray(i2t_rows, dtype=np.int64).reshape(-1, 3),
    )


def _choice(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    if len(a) == 0:
        return float("nan"), 0
    score = (a > b).to(torch.float64) + 0.5 * (a == b).to(torch.float64)
    return 100.0 * float(score.mean()), len(a)


def clone_forced_choice(
    img_emb,
    txt_emb,
    *,
    txt_to_img,
    groups,
    caption_facts: FactSets | Sequence[Sequence[int]],
    image_facts: FactSets | Sequence[Sequence[int]],
) -> CloneChoice:
    """Clone forced choice (see the module docstring) with scores = dot products."""
    img, txt = _as_tensor(img_emb, "img_emb"), _as_tensor(txt_emb, "txt_emb")
    dtype = torch.promote_types(torch.promote_types(img.dtype, txt.dtype), torch.float32)
    img, txt = img.to(dtype), txt.to(dtype)
    t2i, i2t = clone_trials(
        txt_to_img=txt_to_img, groups=groups, caption_facts=caption_facts, image_facts=image_facts
    )
    t2i_t, i2t_t = torch.from_numpy(t2i), torch.from_numpy(i2t)
    own = (txt[t2i_t[:, 0]] * img[t2i_t[:, 1]]).sum(1)
    sib = (txt[t2i_t[:, 0]] * img[t2i_t[:, 2]]).sum(1)
    t_acc, t_n = _choice(own, sib)
    own = (img[i2t_t[:, 0]] * txt[i2t_t[:, 1]]).sum(1)
    sib = (img[i2t_t[:, 0]] * txt[i2t_t[:, 2]]).sum(1)
    i_acc, i_n = _choice(own, sib)
    return CloneChoice(t_acc, i_acc, t_n, i_n)


# ------------------------------------------------------------------------------ query subsets


@dataclass(frozen=True)
class SubsetRecall:
    """Standard recall@K (percent) of a subset of the queries: ``t2i`` over the chosen
    captions, ``i2t`` over the chosen images (NaN where the subset is empty), with the query
    counts. The ranks are those of the full protocol: every image (caption) is a candidate."""

    t2i_r1: float
    t2i_r5: float
    t2i_r10: float
    i2t_r1: float
    i2t_r5: float
    i2t_r10: float
    t2i_queries: int
    i2t_queries: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _subset_mask(mask, n: int, name: str) -> torch.Tensor:
    if mask is None:
        return torch.zeros(n, dtype=torch.bool)
    out = torch.as_tensor(np.asarray(mask))
    if out.dtype != torch.bool or out.shape != (n,):
        raise ValueError(f"{name} must be a boolean array of shape ({n},), got {tuple(out.shape)}")
    return out


def _recall(ranks: torch.Tensor, mask: torch.Tensor, k: int) -> float:
    if not bool(mask.any()):
        return float("nan")
    return 100.0 * float((ranks[mask] < k).to(torch.float64).mean())


def subset_recalls(
    img_emb,
    txt_emb,
    *,
    txt_to_img,
    caption_mask=None,
    image_mask=None,
) -> SubsetRecall:
    """R@1/5/10 of the caption queries in ``caption_mask`` (T->I) and of the image queries in
    ``image_mask`` (I->T), each a boolean array over the split's captions / images (``None``:
    no query of that direction). Ranks follow :func:`vlret.metrics.retrieval_ranks` (ties
    count against the query; an image's rank is that of its best caption)."""
    from ..metrics import retrieval_ranks

    img, txt = _as_tensor(img_emb, "img_emb"), _as_tensor(txt_emb, "txt_emb")
    t2i_of = torch.as_tensor(txt_to_img, dtype=torch.long)
    cap = _subset_mask(caption_mask, txt.shape[0], "caption_mask")
    im = _subset_mask(image_mask, img.shape[0], "image_mask")
    i2t_ranks, t2i_ranks = retrieval_ranks(img, txt, t2i_of)
    return SubsetRecall(
        *(_recall(t2i_ranks, cap, k) for k in (1, 5, 10)),
        *(_recall(i2t_ranks, im, k) for k in (1, 5, 10)),
        int(cap.sum()),
        int(im.sum()),
    )


def clone_group_images(groups) -> np.ndarray:
    """Boolean mask of the images that belong to a clone group of two or more."""
    grp = np.asarray(groups, dtype=np.int64)
    _, inverse, counts = np.unique(grp, return_inverse=True, return_counts=True)
    return counts[inverse] >= 2


__all__ = [
    "CloneChoice",
    "SubsetRecall",
    "clone_group_images",
    "subset_recalls",
    "ExtendedMetrics",
    "FactSets",
    "ambiguity",
    "clone_forced_choice",
    "clone_trials",
    "extended_metrics",
    "fact_oracle_embeddings",
    "iter_relevance",
    "pairs_to_matrix",
    "relevance_matrix",
    "relevance_pairs",
    "rprecision_map_at_r",
]
