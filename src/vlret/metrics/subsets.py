"""Recall@K of a subset of the queries (for instance the captions of one kind), ranked
against every candidate of the full protocol."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .ranks import check_not_empty, retrieval_ranks
from .relevance import _as_matrix


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
    no query of that direction). Ranks follow :func:`~vlret.metrics.ranks.retrieval_ranks` (ties
    count against the query; an image's rank is that of its best caption)."""
    img, txt = _as_matrix(img_emb, "img_emb"), _as_matrix(txt_emb, "txt_emb")
    check_not_empty(img, "img_emb", "image")
    check_not_empty(txt, "txt_emb", "text")
    t2i_of = torch.as_tensor(txt_to_img, dtype=torch.long)
    cap = _subset_mask(caption_mask, txt.shape[0], "caption_mask")
    im = _subset_mask(image_mask, img.shape[0], "image_mask")
    i2t_ranks, t2i_ranks = retrieval_ranks(img, txt, t2i_of)
    return SubsetRecall(
        _recall(t2i_ranks, cap, 1),
        _recall(t2i_ranks, cap, 5),
        _recall(t2i_ranks, cap, 10),
        _recall(i2t_ranks, im, 1),
        _recall(i2t_ranks, im, 5),
        _recall(i2t_ranks, im, 10),
        int(cap.sum()),
        int(im.sum()),
    )


__all__ = ["SubsetRecall", "subset_recalls"]
