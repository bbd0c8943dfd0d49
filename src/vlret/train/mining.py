"""AOQ's offline candidates (Chen et al., ECCV 2020): each image's top-K captions and each
caption's top-K images over a whole split, by a trained model's scores, own positives excluded
(``vlret mine-negatives``; the file format is :mod:`vlret.data.offline_negatives`).

The split is scored in blocks of captions x all images, never as one ``(N_img, N_txt)`` matrix:

* a caption's top-K images come from its row of the block (one ``topk``);
* each image keeps its best K captions so far; a block's entries enter only when they beat the
  image's K-th best (one comparison over the block, then a merge of the few that pass).

Equal scores rank the lower index first (the same selection and order as a stable full sort),
whatever the block size. A two-tower model is encoded once and scored by matrix products
(cosine or dot, as its ``scoring``); a pair-scoring model (SCAN, BFAN, SGRAF, ...) is scored
with the evaluation's own pair scorer (:func:`vlret.eval.score_matrix`), block by block. The
release mined with a two-tower first-round model (VSRN's global similarity), also for BFAN.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._extras import progress_bar
from ..data import check_features
from ..data.offline_negatives import OfflineNegatives
from ..eval import PairModelScorer, TextTokens, TwoTowerScorer, score_matrix
from ..models import PairScorer
from .builders import build_dataset, eval_data_config, load_trained_model
from .distributed import resolve_device

#: Captions per scored block (a block is ``BLOCK x N_img`` float32 scores).
BLOCK = 1024
#: AOQ's default number of candidates (the release draws among the top 300).
DEFAULT_K = 300


def top_k(values: torch.Tensor, k: int, ids: torch.Tensor | None = None):
    """``(scores, ids)`` of the ``k`` best entries of each row of ``values``, ordered by score
    (descending) then id (ascending); ``ids`` (same shape, default the column positions) name
    the entries. ``-inf`` entries are never told apart (they are padding or excluded)."""
    rows, width = values.shape
    take = min(k + 1, width)
    v, pos = values.topk(take, dim=1)
    if torch.isnan(v).any():
        raise ValueError("the model's scores contain NaN")
    finite = v > float("-inf")
    tie = ((v[:, 1:] == v[:, :-1]) & finite[:, 1:]).any(1) if take > 1 else finite[:, 0] & False
    v, pos = v[:, :k], pos[:, :k]
    out_ids = pos if ids is None else ids.gather(1, pos)
    if bool(tie.any()):  # rare: redo the rows with equal scores by a stable sort
        bad = tie.nonzero().squeeze(1)
        sub = values.index_select(0, bad)
        sub_ids = (
            torch.arange(width, device=values.device).expand(len(bad), width)
            if ids is None
            else ids.index_select(0, bad)
        )
        by_id = sub_ids.argsort(dim=1, stable=True)
        sub, sub_ids = sub.gather(1, by_id), sub_ids.gather(1, by_id)
        by_score = sub.argsort(dim=1, descending=True, stable=True)[:, :k]
        v[bad], out_ids[bad] = sub.gather(1, by_score), sub_ids.gather(1, by_score)
    return v, out_ids


def _padded(values: torch.Tensor, where: torch.Tensor, ids: torch.Tensor, sentinel: int):
    """The entries ``where`` (``(n, 2)`` row-major (row, column) pairs of ``values``, grouped by
    row) packed to the left of a ``(rows, widest)`` matrix, ``-inf`` / ``sentinel`` after."""
    row = where[:, 0]
    counts = torch.bincount(row, minlength=values.shape[0])
    col = torch.arange(len(row), device=values.device) - (torch.cumsum(counts, 0) - counts)[row]
    shape = (values.shape[0], int(counts.max()))
    pad = torch.full(shape, float("-inf"), dtype=values.dtype, device=values.device)
    pad_ids = torch.full(shape, sentinel, dtype=torch.long, device=values.device)
    pad[row, col] = values[row, where[:, 1]]
    pad_ids[row, col] = ids
    return pad, pad_ids


def rows_top_k(
    values: torch.Tensor, k: int, ids: torch.Tensor | None = None, *, sample_rank: int = 8
):
    """:func:`top_k` of wide rows, exact, through a cheap filter: a threshold per
    row from a strided sample of its columns (its ``sample_rank``-th best, about ``2k`` entries
    expected at or above it); rows with at least ``k`` entries at or above their threshold keep
    only those (every entry of the top ``k``, ties included, is among them), the others are
    ranked whole."""
    rows, width = values.shape
    m = 2 * sample_rank * width // k
    if m < sample_rank or 2 * m > width:
        return top_k(values, k, ids)
    thr = values[:, :: width // m].topk(sample_rank, dim=1).values[:, -1:]
    passed = values >= thr
    ok = passed.sum(dim=1) >= k
    v = torch.empty(rows, k, dtype=values.dtype, device=values.device)
    bad, good = (~ok).nonzero().squeeze(1), ok.nonzero().squeeze(1)
    out = torch.empty(rows, k, dtype=torch.long, device=values.device)
    if len(bad):
        sub_ids = None if ids is None else ids.index_select(0, bad)
        v[bad], out[bad] = top_k(values.index_select(0, bad), k, sub_ids)
    if len(good):
        sub = values.index_select(0, good)
        where = passed.index_select(0, good).nonzero()
        named = where[:, 1] if ids is None else ids.index_select(0, good)[where[:, 0], where[:, 1]]
        sentinel = width if ids is None else int(ids.max()) + 1
        pad, pad_ids = _padded(sub, where, named, sentinel)
        v[good], out[good] = top_k(pad, k, pad_ids)
    return v, out


def check_k(k: int, n_images: int, txt_to_img: torch.Tensor) -> None:
    """``k`` must leave every caption ``k`` other images and every image ``k`` other captions."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {k!r}")
    own = int(torch.bincount(txt_to_img, minlength=n_images).max()) if len(txt_to_img) else 0
    n_txt = len(txt_to_img)
    if k > n_images - 1:
        raise ValueError(
            f"k: {k} is larger than the gallery minus the positives: {n_images - 1} images per "
            f"caption ({n_images} images, 1 its own)"
        )
    if k > n_txt - own:
        raise ValueError(
            f"k: {k} is larger than the gallery minus the positives: {n_txt - own} captions per "
            f"image ({n_txt} captions, up to {own} its own)"
        )


@torch.no_grad()
def mine_blocks(
    score_block: Callable[[int, int], torch.Tensor],
    *,
    n_images: int,
    txt_to_img: Any,
    k: int = DEFAULT_K,
    block_size: int = BLOCK,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> OfflineNegatives:
    """Mine from ``score_block(t0, t1)``, the ``(t1 - t0, n_images)`` scores of captions
    ``t0:t1`` against every image (any device; scored in float32 on ``device``).

    Raises:
        ValueError: ``k`` larger than the gallery minus the positives, a bad block size, a
            block of the wrong shape or with NaN scores.
    """
    t2img = torch.as_tensor(txt_to_img, dtype=torch.long).cpu()
    check_k(k, n_images, t2img)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive integer, got {block_size!r}")
    n_txt = len(t2img)
    dev = torch.device(device)
    t2img_dev = t2img.to(dev)
    neg_inf = float("-inf")
    # each image's best k captions so far; placeholders: -inf, id n_txt (they lose every tie)
    best = torch.full((n_images, k), neg_inf, device=dev)
    best_ids = torch.full((n_images, k), n_txt, dtype=torch.long, device=dev)
    t2i = torch.empty(n_txt, k, dtype=torch.long)
    t2i_scores = torch.empty(n_txt, k)
    bar = None
    if progress:
        bar = progress_bar(total=n_txt, desc="mining", unit="caption", dynamic_ncols=True)
    try:
        for t0 in range(0, n_txt, block_size):
            t1 = min(t0 + block_size, n_txt)
            s = score_block(t0, t1).to(device=dev, dtype=torch.float32)
            if s.shape != (t1 - t0, n_images):
                raise ValueError(
                    f"score_block({t0}, {t1}): expected shape {(t1 - t0, n_images)}, got "
                    f"{tuple(s.shape)}"
                )
            rows = torch.arange(t1 - t0, device=dev)
            s[rows, t2img_dev[t0:t1]] = neg_inf  # own positives, in both directions
            if bool(torch.isnan(s).any()):
                raise ValueError(f"the model's scores of captions {t0}:{t1} contain NaN")
            v, ids = rows_top_k(s, k)
            t2i[t0:t1], t2i_scores[t0:t1] = ids.cpu(), v.cpu()
            _merge_images(best, best_ids, s, t0, n_txt)
            if bar is not None:
                bar.update(t1 - t0)
    finally:
        if bar is not None:
            bar.close()
    return OfflineNegatives(
        i2t=best_ids.cpu().numpy().astype(np.int64),
        t2i=t2i.numpy().astype(np.int64),
        i2t_scores=best.cpu().numpy().astype(np.float32),
        t2i_scores=t2i_scores.numpy().astype(np.float32),
        txt_to_img=t2img.numpy().astype(np.int64),
        header={"k": k, "ties": "lower index first"},
    )


def _merge_images(
    best: torch.Tensor, best_ids: torch.Tensor, s: torch.Tensor, t0: int, sentinel: int
) -> None:
    """Merge the block ``s`` (captions ``t0:`` x images) into each image's best captions, in
    place: only entries above the image's current k-th best can enter (an equal one has a higher
    caption id than every kept one, so it loses the tie). Padding is ``-inf`` with the id
    ``sentinel``, as the placeholders."""
    passed = s.t() > best[:, -1:]  # (n_images, c), strict: equal scores keep the earlier ids
    n_passed = int(passed.sum())
    if n_passed == 0:
        return
    if n_passed * 8 > passed.numel():  # the first blocks: most entries pass, merge densely
        ids = torch.arange(t0, t0 + s.shape[0], device=s.device).expand(best.shape[0], -1)
        merged = torch.cat([best, s.t()], dim=1)
        v, kept = rows_top_k(merged, best.shape[1], torch.cat([best_ids, ids], dim=1))
        best.copy_(v)
        best_ids.copy_(kept)
        return
    where = passed.nonzero()  # row-major: grouped by image, captions ascending
    active = torch.unique_consecutive(where[:, 0])
    slot = torch.empty(best.shape[0], dtype=torch.long, device=s.device)
    slot[active] = torch.arange(len(active), device=s.device)
    local = torch.stack([slot[where[:, 0]], where[:, 1]], dim=1)
    pad, pad_ids = _padded(s.t().index_select(0, active), local, where[:, 1] + t0, sentinel)
    merged = torch.cat([best.index_select(0, active), pad], dim=1)
    merged_ids = torch.cat([best_ids.index_select(0, active), pad_ids], dim=1)
    v, ids = top_k(merged, best.shape[1], merged_ids)
    best[active], best_ids[active] = v, ids


def mine_embeddings(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    txt_to_img: Any,
    *,
    k: int = DEFAULT_K,
    block_size: int = BLOCK,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> OfflineNegatives:
    """:func:`mine_blocks` of two-tower embeddings: scores are ``txt_emb @ img_emb.T`` as given
    (normalise them first for cosine scores), one block of captions at a time on ``device``."""
    if img_emb.dim() != 2 or txt_emb.dim() != 2 or img_emb.shape[1] != txt_emb.shape[1]:
        raise ValueError(
            f"img_emb {tuple(img_emb.shape)} and txt_emb {tuple(txt_emb.shape)}: expected "
            "(N_img, D) and (N_txt, D)"
        )
    if len(torch.as_tensor(txt_to_img)) != txt_emb.shape[0]:
        raise ValueError(
            f"txt_to_img: one image per caption expected ({txt_emb.shape[0]}), got "
            f"{len(torch.as_tensor(txt_to_img))}"
        )
    img = img_emb.to(device=device, dtype=torch.float32)

    def block(t0: int, t1: int) -> torch.Tensor:
        return txt_emb[t0:t1].to(device=device, dtype=torch.float32) @ img.t()

    return mine_blocks(
        block,
        n_images=img_emb.shape[0],
        txt_to_img=txt_to_img,
        k=k,
        block_size=block_size,
        device=device,
        progress=progress,
    )


def mine_pair_model(
    model: torch.nn.Module,
    regions: torch.Tensor,
    texts: TextTokens,
    txt_to_img: Any,
    *,
    k: int = DEFAULT_K,
    block_size: int = BLOCK,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> OfflineNegatives:
    """:func:`mine_blocks` of a pair-scoring model's scores (the evaluation's
    :func:`~vlret.eval.score_matrix` on each block of captions against every image)."""

    def block(t0: int, t1: int) -> torch.Tensor:
        a, b = int(texts.offsets[t0]), int(texts.offsets[t1])
        part = TextTokens(texts.words[a:b], texts.lengths[t0:t1])
        return score_matrix(model, regions, part, device=device).t()

    return mine_blocks(
        block,
        n_images=regions.shape[0],
        txt_to_img=txt_to_img,
        k=k,
        block_size=block_size,
        device=device,
        progress=progress,
    )


def mine_checkpoint(
    checkpoint: str | Path,
    *,
    data: str | Path,
    split: str = "train",
    k: int = DEFAULT_K,
    batch_size: int = 256,
    device: str = "auto",
    progress: bool = False,
    block_size: int = BLOCK,
) -> OfflineNegatives:
    """Load a ``vlret train`` checkpoint, read ``split`` of the data folder ``data`` with the
    checkpoint's data settings (:func:`~vlret.train.builders.eval_data_config`, as ``vlret
    eval``) and mine it; the header records the checkpoint, split, scoring and model kind.

    Raises:
        FileNotFoundError: A missing checkpoint or data folder.
        ValueError: An unreadable checkpoint, a bad split or ``k`` (named).
    """
    if not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the {split} split")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise ValueError(f"device: {err}") from None
    model, run, encoder = load_trained_model(checkpoint, device=dev)
    dataset = build_dataset(
        eval_data_config(run.data, data),
        split,
        encoder,
        image_transform=getattr(model, "image_transform", None),
    )
    in_dim = getattr(getattr(model, "image_encoder", None), "in_dim", None)
    check_features(dataset, in_dim=in_dim if isinstance(in_dim, int) else None)
    check_k(k, dataset.num_images, torch.as_tensor(dataset.txt_to_img))  # before encoding
    options: dict[str, Any] = {"k": k, "block_size": block_size, "device": dev}
    if isinstance(model, PairScorer):
        scorer = PairModelScorer(model, batch_size=batch_size, device=dev)
        regions, texts = scorer.tokens(dataset)
        mined = mine_pair_model(
            model, regions, texts, dataset.txt_to_img, progress=progress, **options
        )
        scoring = "pair scores"
    else:
        tower = TwoTowerScorer(model, scoring=run.scoring, batch_size=batch_size, device=dev)
        img, txt = tower.embeddings(dataset)
        mined = mine_embeddings(img, txt, dataset.txt_to_img, progress=progress, **options)
        scoring = str(tower.scoring)
    kind = run.model.get("kind", type(model).__name__) if isinstance(run.model, dict) else None
    header = {
        **mined.header,
        "checkpoint": str(checkpoint),
        "split": split,
        "scoring": scoring,
        "model": kind or type(model).__name__,
    }
    return OfflineNegatives(
        mined.i2t, mined.t2i, mined.i2t_scores, mined.t2i_scores, mined.txt_to_img, header
    )


__all__ = [
    "BLOCK",
    "DEFAULT_K",
    "check_k",
    "mine_blocks",
    "mine_checkpoint",
    "mine_embeddings",
    "mine_pair_model",
    "top_k",
]
