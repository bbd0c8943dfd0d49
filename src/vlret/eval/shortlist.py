"""The approximate shortlist protocol (opt-in): each query's top-``k`` candidates by a two-tower
score, re-ranked by a pair-scoring model's exact scores (:func:`shortlist_metrics`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .._modules import unwrap_model
from ..metrics import RetrievalMetrics, average_metrics, metrics_from_ranks, rank_blocks
from .encode import TextTokens, check_device
from .scores import TEXT_BLOCK, Block, check_blocks, members_of, progress_pairs


@dataclass
class ShortlistResult:
    """Metrics of the shortlist protocol (:func:`shortlist_metrics`) and its coverage."""

    metrics: RetrievalMetrics
    #: the shortlist length actually used per direction (``k`` capped at the candidates)
    k_i2t: int
    k_t2i: int
    #: fraction of image queries with at least one of their captions in the shortlist
    i2t_in_shortlist: float
    #: fraction of caption queries with their image in the shortlist
    t2i_in_shortlist: float
    #: distinct pairs scored exactly
    pairs_scored: int


@torch.no_grad()
def shortlist_metrics(
    models: nn.Module | Sequence[nn.Module],
    regions: torch.Tensor | Sequence[torch.Tensor],
    texts: TextTokens | Sequence[TextTokens],
    txt_to_img,
    shortlist_sim: torch.Tensor,
    *,
    k: int,
    device: torch.device | str,
    blocks: Sequence[Block] | None = None,
    progress: bool = False,
    text_block: int = TEXT_BLOCK,
    max_elements: int | None = None,
) -> ShortlistResult:
    """Approximate metrics: each query's top-``k`` candidates by ``shortlist_sim`` (a two-tower
    score, ``(N_img, N_txt)``), re-ranked by the exact pair scores of ``models`` (ensembles:
    the mean); every candidate outside a query's shortlist ranks below all of its shortlisted
    ones, and among themselves in ``shortlist_sim`` order.

    So an image's i2t rank is its best shortlisted caption's rank among the shortlist by exact
    score, or, when none of its captions is shortlisted, ``k`` + the rank of its best caption
    by ``shortlist_sim`` among the non-shortlisted captions; a caption's t2i rank likewise.
    With ``k`` >= the number of candidates this is the exact protocol. ``blocks`` restricts
    queries and candidates to each block (the COCO 1K folds), the metrics averaged over them.
    Ties count against the query, as in :mod:`vlret.metrics`.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive integer (shortlist length), got {k!r}")
    model_list, region_list, text_list = members_of(models, regions, texts)
    n_img, n_txt = region_list[0].shape[0], len(text_list[0])
    if not isinstance(shortlist_sim, torch.Tensor) or shortlist_sim.shape != (n_img, n_txt):
        raise ValueError(f"shortlist_sim: expected a ({n_img}, {n_txt}) score matrix")
    device = check_device(device)
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long).cpu()
    if t2i.shape != (n_txt,):
        raise ValueError(f"txt_to_img must have one entry per caption ({n_txt})")
    spans = check_blocks(blocks, n_img, n_txt)
    plans = [_shortlist_plan(shortlist_sim, t2i, span, k) for span in spans]
    keys = torch.cat([plan[-1] for plan in plans]).unique()  # global pairs, sorted
    bar = progress_pairs(len(model_list) * keys.numel(), "scoring shortlisted pairs", progress)
    values = torch.zeros(keys.numel(), dtype=torch.float32)
    try:
        for model, reg, txt in zip(model_list, region_list, text_list, strict=True):
            values += _score_pairs(
                unwrap_model(model), reg, txt, keys, device, text_block, max_elements, bar
            )
    finally:
        if bar is not None:
            bar.close()
    values /= len(model_list)
    folds: list[RetrievalMetrics] = []
    inside: list[list[torch.Tensor]] = [[], []]
    for (i0, i1, t0, t1), (tt, local, s_i2t, s_t2i, _) in zip(spans, plans, strict=True):
        img, txt = torch.arange(i0, i1)[:, None], torch.arange(t0, t1)[:, None]
        exact_i2t = values[torch.searchsorted(keys, img * n_txt + s_i2t + t0)]
        exact_t2i = values[torch.searchsorted(keys, (s_t2i + i0) * n_txt + txt)]
        r_i2t, in_i2t = _shortlist_ranks(tt, exact_i2t, s_i2t, local, images_are_queries=True)
        r_t2i, in_t2i = _shortlist_ranks(tt, exact_t2i, s_t2i, local, images_are_queries=False)
        folds.append(metrics_from_ranks(r_i2t, r_t2i))
        inside[0].append(in_i2t)
        inside[1].append(in_t2i)
    return ShortlistResult(
        folds[0] if blocks is None else average_metrics(folds),
        k_i2t=min(plan[2].shape[1] for plan in plans),
        k_t2i=min(plan[3].shape[1] for plan in plans),
        i2t_in_shortlist=_fraction(inside[0]),
        t2i_in_shortlist=_fraction(inside[1]),
        pairs_scored=int(keys.numel()),
    )


def _fraction(flags: list[torch.Tensor]) -> float:
    return int(sum(int(f.sum()) for f in flags)) / sum(f.numel() for f in flags)


def _shortlist_plan(shortlist_sim, t2i, span, k):
    """One block's shortlist scores ``tt``, local image of each caption, the top-``k``
    candidates of each image ``(n_i, k)`` and caption ``(n_t, k)``, and the global pair keys
    (``image * N_txt + caption``) to score."""
    i0, i1, t0, t1 = span
    tt = shortlist_sim[i0:i1, t0:t1].float().cpu()
    local = t2i[t0:t1] - i0
    if int(local.min()) < 0 or int(local.max()) >= i1 - i0:
        raise ValueError(f"blocks: the captions of block {span} belong to other images")
    if not bool(torch.isfinite(tt).all()):
        raise ValueError("shortlist_sim: NaN or inf inside the scored blocks")
    s_i2t = tt.topk(min(k, t1 - t0), dim=1).indices  # caption candidates of each image
    s_t2i = tt.topk(min(k, i1 - i0), dim=0).indices.t().contiguous()  # image candidates
    n_txt = shortlist_sim.shape[1]
    img, txt = torch.arange(i0, i1)[:, None], torch.arange(t0, t1)[:, None]
    keys = torch.cat(
        [(img * n_txt + s_i2t + t0).reshape(-1), ((s_t2i + i0) * n_txt + txt).reshape(-1)]
    )
    return tt, local, s_i2t, s_t2i, keys


def _score_pairs(model, regions, texts, keys, device, text_block, max_elements, bar):
    """Exact scores of the pairs ``keys`` (``image * N_txt + caption``, sorted): one
    ``model.score`` call per image and block of its captions (by length, padded to the block's
    longest), so no pair outside ``keys`` is scored."""
    was_training = model.training
    model.eval()
    out = torch.empty(keys.numel(), dtype=torch.float32)
    n_txt = len(texts)
    try:
        texts = texts.to(device)
        images, counts = torch.unique_consecutive(keys // n_txt, return_counts=True)
        start = 0
        for i, count in zip(images.tolist(), counts.tolist(), strict=True):
            caps = (keys[start : start + count] % n_txt).to(device)
            order = torch.argsort(texts.lengths.index_select(0, caps), stable=True)
            reg = regions[i : i + 1].to(device=device, dtype=torch.float32)
            for c in range(0, count, text_block):
                pick = order[c : c + text_block]
                words, lens = texts.gather(caps[pick])
                s = model.score(reg, words, lens, max_elements=max_elements)
                out[start + pick.cpu()] = s[0].float().cpu()
                if bar is not None:
                    bar.update(int(pick.numel()))
            start += count
    finally:
        model.train(was_training)
    return out


def _shortlist_ranks(
    tt: torch.Tensor,
    exact: torch.Tensor,
    shortlist: torch.Tensor,
    txt_to_img: torch.Tensor,
    *,
    images_are_queries: bool,
    tile: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ranks of each query under the shortlist protocol and whether its ground truth
    (i2t: any of the image's captions) was shortlisted. ``tt (n_img, n_txt)`` is the shortlist
    score, ``shortlist (n_q, k)`` the candidates of each query, ``exact (n_q, k)`` their
    exact scores; the queries outside their shortlist are ranked ``tile`` rows at a time. Both
    are counted by the ranking core (:func:`~vlret.metrics.rank_blocks`, ties against the
    query) with each block's own relevance mask: a query's gallery is its shortlist, or the
    candidates left out of it."""
    n_img = tt.shape[0]
    n_q, k = shortlist.shape
    queries = torch.arange(n_q)
    if images_are_queries:
        is_gt = txt_to_img[shortlist] == queries[:, None]
        scores = tt  # rows = queries
    else:
        is_gt = shortlist == txt_to_img[:, None]
        scores = tt.t()
    inside = is_gt.any(dim=1)
    ranks = torch.empty(n_q, dtype=torch.long)
    listed = torch.nonzero(inside).squeeze(1)
    if listed.numel():  # by exact score among the shortlist
        blocks = [(0, exact.index_select(0, listed), is_gt.index_select(0, listed))]
        ranks[listed] = rank_blocks(blocks, n_queries=listed.numel()).first
    outside = torch.nonzero(~inside).squeeze(1)
    for a in range(0, outside.numel(), tile):
        # below the shortlist, by shortlist score among the candidates left out of it
        q = outside[a : a + tile]
        row = scores.index_select(0, q)  # (c, n_cand)
        if images_are_queries:
            gt = txt_to_img[None, :] == q[:, None]
        else:
            gt = torch.arange(n_img)[None, :] == txt_to_img[q][:, None]
        rest = torch.ones_like(gt).scatter_(1, shortlist[q], False)  # k distinct candidates
        left = (row[rest].view(len(q), -1), gt[rest].view(len(q), -1))
        ranks[q] = k + rank_blocks([(0, *left)], n_queries=len(q)).first
    return ranks, inside


__all__ = ["ShortlistResult", "shortlist_metrics"]
