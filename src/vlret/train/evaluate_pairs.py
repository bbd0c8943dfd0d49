"""Evaluation of pair-scoring (cross-attention) models: SCAN, BFAN, SGRAF.

A two-tower model gives each image and caption one vector and the score matrix is one matmul. A
cross-attention model scores each (image, caption) pair from the image's regions and the
caption's words together (SCAN Eq. 1-4), so the evaluation here

1. encodes every image's regions once and every caption's words once (:func:`encode_tokens`);
   the words are stored packed (:class:`TextTokens`: the real tokens of all captions one after
   the other, no padding), so COCO 5K's 25,000 captions take their ~290,000 tokens' worth of
   memory, not 25,000 x the longest caption's;
2. scores image blocks x caption blocks with ``model.score`` on the device
   (:func:`score_matrix`); captions are scored in order of length, each caption block padded to
   its own longest caption, and the scores land in a CPU float32 ``(N_img, N_txt)`` matrix.
   Only the requested blocks are scored: the COCO 1K protocol scores the 5 diagonal fold blocks
   (5 x 1000 x 5000 pairs, not 5000 x 25000);
3. ranks from the score matrix with :func:`vlret.metrics.retrieval_metrics_from_similarity`.

Ensembles average the members' score matrices (the papers' "*" rows: SCAN t2i + i2t, SGRAF =
SGR + SAF).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .._extras import progress_bar
from ..data import RetrievalDataset
from ..metrics import (
    RetrievalMetrics,
    average_metrics,
    metrics_from_ranks,
    retrieval_metrics_from_similarity,
)

#: Default block of one ``model.score`` call: images x captions (memory inside the call is
#: bounded by the scorer's own ``max_elements``).
IMAGE_BLOCK = 128
TEXT_BLOCK = 1024


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _check_device(device: torch.device | str) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: {err}") from None


@dataclass(eq=False)
class TextTokens:
    """Word features of ``N`` captions, packed: caption ``j``'s ``lengths[j]`` words are rows
    ``offsets[j]:offsets[j + 1]`` of ``words (sum(lengths), D)``.

    :meth:`gather` assembles any set of captions as the padded ``(n, L, D)`` block a scorer
    takes, ``L`` being the longest caption of that set (padding rows are zero, as the word
    encoder's).
    """

    words: torch.Tensor
    lengths: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.words, torch.Tensor) or self.words.dim() != 2:
            raise ValueError("words must be a 2-D tensor (total tokens, D) of packed captions")
        if (
            not isinstance(self.lengths, torch.Tensor)
            or self.lengths.dim() != 1
            or self.lengths.dtype.is_floating_point
        ):
            raise ValueError("lengths must be a 1-D integer tensor (one length per caption)")
        self.lengths = self.lengths.to(device=self.words.device, dtype=torch.long)
        if self.lengths.numel() and int(self.lengths.min()) < 1:
            raise ValueError("lengths must be >= 1 (a caption has at least one word)")
        total = int(self.lengths.sum())
        if total != self.words.shape[0]:
            raise ValueError(
                f"words has {self.words.shape[0]} rows but lengths sum to {total} tokens"
            )
        self.offsets = torch.zeros(
            len(self.lengths) + 1, dtype=torch.long, device=self.words.device
        )
        torch.cumsum(self.lengths, 0, out=self.offsets[1:])

    def __len__(self) -> int:
        return int(self.lengths.numel())

    @property
    def dim(self) -> int:
        return int(self.words.shape[1])

    def to(self, device: torch.device | str) -> TextTokens:
        return TextTokens(self.words.to(device), self.lengths.to(device))

    def gather(self, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(words (n, L, D), lengths (n,))`` of the captions ``index`` (all if ``None``), on
        this object's device, padded with zeros to the longest of them."""
        if index is None:
            index = torch.arange(len(self), device=self.words.device)
        index = index.to(device=self.words.device, dtype=torch.long)
        lengths = self.lengths.index_select(0, index)
        n = int(index.numel())
        width = int(lengths.max()) if n else 0
        steps = torch.arange(width, device=self.words.device)
        mask = steps[None, :] < lengths[:, None]
        rows = (self.offsets.index_select(0, index)[:, None] + steps[None, :]).masked_fill(~mask, 0)
        if self.words.shape[0] == 0:
            return self.words.new_zeros(n, width, self.dim), lengths
        out = self.words.index_select(0, rows.reshape(-1)).view(n, width, self.dim)
        return out.masked_fill_(~mask[:, :, None], 0.0), lengths

    def mean_pooled(self) -> torch.Tensor:
        """``(N, D)``: each caption's mean word feature (float32)."""
        owner = torch.repeat_interleave(
            torch.arange(len(self), device=self.words.device), self.lengths
        )
        sums = torch.zeros(len(self), self.dim, dtype=torch.float32, device=self.words.device)
        sums.index_add_(0, owner, self.words.float())
        return sums / self.lengths[:, None].float()


def pack_words(words: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The real tokens of a padded ``(n, L, D)`` batch, caption after caption ``(sum, D)``."""
    lengths = lengths.to(words.device)
    mask = torch.arange(words.shape[1], device=words.device)[None, :] < lengths[:, None]
    return words[mask]


@torch.no_grad()
def encode_tokens(
    model: nn.Module,
    dataset: RetrievalDataset,
    *,
    batch_size: int = 128,
    device: torch.device | str,
    num_workers: int = 0,
) -> tuple[torch.Tensor, TextTokens]:
    """``(regions (N_img, R, D), words)``: every image's region features and every caption's
    word features from ``model.encode_images`` / ``model.encode_texts``, each image and
    caption encoded once, in float32 on the CPU (words packed, :class:`TextTokens`).

    The model is put in eval mode and its training mode restored afterwards."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    device = _check_device(device)
    model = _unwrap(model)
    was_training = model.training
    gen = torch.Generator().manual_seed(0)  # loaders leave the global RNG untouched
    model.eval()
    try:
        regions = encoded_images(model, dataset, batch_size, device, num_workers, gen)
        texts = dataset.texts()
        packed, lengths = [], []
        for caps, lens, _ in DataLoader(
            texts,
            batch_size=batch_size,
            collate_fn=texts.collate,
            num_workers=num_workers,
            generator=gen,
        ):
            if lens is None:
                raise ValueError(
                    "encode_tokens needs token ids (a dataset with a caption encoder), got raw text"
                )
            # a vlret pair-scoring model's methods (duck-typed: no common base class)
            words = cast(Any, model).encode_texts(caps.to(device), lens.to(device))
            # a multi-expert model's "words" are its E per-expert vectors, not the tokens
            if hasattr(model, "token_lengths"):
                lens = cast(Any, model).token_lengths(lens)
            packed.append(pack_words(words.float(), lens).cpu())
            lengths.append(lens.cpu())
    finally:
        model.train(was_training)
    dim = regions[0].shape[-1] if regions else 0
    words = torch.cat(packed) if packed else torch.zeros(0, dim)
    lens = torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.long)
    return torch.cat(regions), TextTokens(words, lens)


def encoded_images(model, dataset, batch_size, device, num_workers, generator) -> list:
    """``model.encode_images`` of each image once, per batch, float32 on the CPU (the caller
    sets eval mode; the loader draws from ``generator``, never from the global RNG)."""
    images = dataset.images()
    out = []
    for feats, _ in DataLoader(
        images,
        batch_size=batch_size,
        collate_fn=images.collate,
        num_workers=num_workers,
        generator=generator,
    ):
        if hasattr(feats, "to"):  # a tensor or an ExpertBatch (image paths stay a list)
            feats = feats.to(device)
        out.append(model.encode_images(feats).float().cpu())
    return out


def _check_blocks(blocks, n_img: int, n_txt: int) -> list[tuple[int, int, int, int]]:
    if blocks is None:
        return [(0, n_img, 0, n_txt)]
    out: list[tuple[int, int, int, int]] = []
    for b in blocks:
        if len(b) != 4 or not all(isinstance(v, int) for v in b):
            raise ValueError(f"blocks: expected (img0, img1, txt0, txt1) integer tuples, got {b!r}")
        i0, i1, t0, t1 = b
        if not (0 <= i0 <= i1 <= n_img and 0 <= t0 <= t1 <= n_txt):
            raise ValueError(f"blocks: {b!r} lies outside the {n_img} images x {n_txt} captions")
        for j0, j1, u0, u1 in out:
            if max(i0, j0) < min(i1, j1) and max(t0, u0) < min(t1, u1):
                raise ValueError(f"blocks: {b!r} and {(j0, j1, u0, u1)!r} overlap")
        out.append((i0, i1, t0, t1))
    return out


def _members(models, regions, texts) -> tuple[list, list, list]:
    """Models, regions and texts as three lists of the same length (shared inputs repeated)."""
    model_list = [models] if isinstance(models, nn.Module) else list(models)
    if not model_list or not all(isinstance(m, nn.Module) for m in model_list):
        raise ValueError("models: expected a model or a non-empty sequence of models")
    n = len(model_list)
    lists = []
    for name, value in (("regions", regions), ("texts", texts)):
        value = [value] * n if isinstance(value, torch.Tensor | TextTokens) else list(value)
        if len(value) != n:
            raise ValueError(f"{name}: one per model expected ({n}), got {len(value)}")
        lists.append(value)
    for r, t in zip(*lists, strict=True):
        if not isinstance(r, torch.Tensor) or r.dim() != 3:
            raise ValueError("regions must be a (N_img, R, D) tensor")
        if not isinstance(t, TextTokens):
            raise ValueError("texts must be TextTokens (see encode_tokens)")
        if (r.shape[0], len(t)) != (lists[0][0].shape[0], len(lists[1][0])):
            raise ValueError(
                "regions/texts: every model must score the same images and captions, got "
                f"{r.shape[0]} x {len(t)} and {lists[0][0].shape[0]} x {len(lists[1][0])}"
            )
    return model_list, lists[0], lists[1]


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    options = {"desc": desc, "unit": "pair", "unit_scale": True, "dynamic_ncols": True}
    return progress_bar(total=total, leave=False, **options)


@torch.no_grad()
def score_matrix(
    models: nn.Module | Sequence[nn.Module],
    regions: torch.Tensor | Sequence[torch.Tensor],
    texts: TextTokens | Sequence[TextTokens],
    *,
    device: torch.device | str,
    blocks: Sequence[tuple[int, int, int, int]] | None = None,
    progress: bool = False,
    image_block: int = IMAGE_BLOCK,
    text_block: int = TEXT_BLOCK,
    max_elements: int | None = None,
) -> torch.Tensor:
    """``(N_img, N_txt)`` float32 CPU matrix of ``model.score`` for every image x caption pair.

    ``models``: one pair-scoring model or several (an ensemble: the mean of their matrices);
    ``regions (N_img, R, D)`` and ``texts`` from :func:`encode_tokens`, one of each per model
    when the members encode differently (each must be given its own). ``blocks``: the
    ``(img0, img1, txt0, txt1)`` ranges to score (e.g. the COCO 1K folds' diagonal blocks),
    ``None`` = all; entries outside every block are NaN. ``image_block`` x ``text_block`` pairs
    go to one ``model.score`` call (with ``max_elements`` bounding its intermediates);
    ``progress`` shows a tqdm bar in pairs with pairs/s and the ETA. Models are used in eval
    mode; their training mode is restored.
    """
    model_list, region_list, text_list = _members(models, regions, texts)
    n = len(model_list)
    for name, v in (("image_block", image_block), ("text_block", text_block)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    device = _check_device(device)
    n_img, n_txt = region_list[0].shape[0], len(text_list[0])
    spans = _check_blocks(blocks, n_img, n_txt)
    out = torch.full((n_img, n_txt), math.nan, dtype=torch.float32)
    for i0, i1, t0, t1 in spans:
        out[i0:i1, t0:t1] = 0.0
    total = n * sum((i1 - i0) * (t1 - t0) for i0, i1, t0, t1 in spans)
    bar = _progress_bar(total, "scoring pairs", progress)
    try:
        for model, reg, txt in zip(model_list, region_list, text_list, strict=True):
            blocking = (device, image_block, text_block, max_elements, bar)
            _score_into(out, _unwrap(model), reg, txt, spans, *blocking)
    finally:
        if bar is not None:
            bar.close()
    if n > 1:
        out /= n
    return out


def _score_into(
    out, model, regions, texts, spans, device, image_block, text_block, max_elements, bar
):
    """Add ``model``'s scores of the ``spans`` to ``out`` (CPU float32): for each span, its
    captions in order of length in blocks of ``text_block``, each padded to its own longest
    caption, against its images in blocks of ``image_block``."""
    was_training = model.training
    model.eval()
    try:
        texts = texts.to(device)
        for i0, i1, t0, t1 in spans:
            order = torch.argsort(texts.lengths[t0:t1], stable=True) + t0
            blocks = [order[a : a + text_block] for a in range(0, t1 - t0, text_block)]
            blocks = [(index - t0, *texts.gather(index)) for index in blocks]
            for a in range(i0, i1, image_block):
                b = min(a + image_block, i1)
                reg = regions[a:b].to(device=device, dtype=torch.float32)
                row = torch.empty(b - a, t1 - t0, dtype=torch.float32, device=device)
                for index, words, lengths in blocks:
                    s = model.score(reg, words, lengths, max_elements=max_elements)
                    row.index_copy_(1, index, s.float())
                    if bar is not None:
                        bar.update((b - a) * int(index.numel()))
                out[a:b, t0:t1] += row.cpu()
    finally:
        model.train(was_training)


def dev_metrics_from_scores(sim: torch.Tensor, txt_to_img) -> dict[str, float]:
    """Model-selection metrics from a pair-scoring model's ``(N_img, N_txt)`` score matrix: the
    retrieval metrics, ``pos_sim`` (the mean score of the matching pairs) and
    ``hardest_neg_sim`` (the mean over every image and caption query of its hardest
    non-matching score; Unified Fig. 4), in the model's own score units (not cosines)."""
    out: dict[str, Any] = retrieval_metrics_from_similarity(sim, txt_to_img).as_dict()
    sim = sim.float()
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long, device=sim.device)
    pos = t2i[None, :] == torch.arange(sim.shape[0], device=sim.device)[:, None]
    neg = sim.masked_fill(pos, -math.inf)
    hardest = torch.cat([neg.amax(dim=1), neg.amax(dim=0)])
    hardest = hardest[torch.isfinite(hardest)]  # a query without negatives has none
    out["pos_sim"] = float(sim.gather(0, t2i[None, :]).mean())
    out["hardest_neg_sim"] = float(hardest.mean()) if hardest.numel() else float("nan")
    return out


# -- protocols on score matrices ------------------------------------------------------------------


def fold_blocks(txt_to_img, n_folds: int) -> list[tuple[int, int, int, int]]:
    """The COCO 1K protocol's diagonal blocks ``(img0, img1, txt0, txt1)``: ``n_folds``
    contiguous folds of images, each with its own captions (which must be contiguous: captions
    grouped by image, as in every supported data layout)."""
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long).cpu()
    if t2i.dim() != 1 or t2i.numel() == 0:
        raise ValueError("txt_to_img must be a non-empty 1-D integer tensor")
    n_img = int(t2i.max()) + 1
    if not isinstance(n_folds, int) or n_folds < 1 or n_img % n_folds:
        raise ValueError(
            f"coco1k averages {n_folds} folds of equal size (COCO testall: 5 x 1000 images); "
            f"this split has {n_img} images, not divisible by {n_folds} (use coco5k)"
        )
    if bool((t2i[1:] < t2i[:-1]).any()):
        raise ValueError("txt_to_img: the folds need captions grouped by image (non-decreasing)")
    size = n_img // n_folds
    bounds = torch.searchsorted(t2i, torch.arange(0, n_img + 1, size)).tolist()
    return [(f * size, (f + 1) * size, bounds[f], bounds[f + 1]) for f in range(n_folds)]


def metrics_from_scores(
    sim: torch.Tensor, txt_to_img, *, blocks: Sequence[tuple[int, int, int, int]] | None = None
) -> RetrievalMetrics:
    """Retrieval metrics of a score matrix; with ``blocks`` (:func:`fold_blocks`), each block's
    metrics (its captions must belong to its images) averaged as the COCO 1K protocol
    (:func:`~vlret.metrics.average_metrics`, per-fold results in ``.folds``)."""
    if blocks is None:
        return retrieval_metrics_from_similarity(sim, txt_to_img)
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long)
    folds = [
        retrieval_metrics_from_similarity(sim[i0:i1, t0:t1], t2i[t0:t1] - i0)
        for i0, i1, t0, t1 in blocks
    ]
    return average_metrics(folds)


def embedding_scores(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    blocks: Sequence[tuple[int, int, int, int]] | None = None,
) -> torch.Tensor:
    """``(N_img, N_txt)`` float32 CPU dot products of two-tower embeddings (cosines when they
    are normalised), only inside ``blocks`` (NaN elsewhere); for ensembles and shortlists."""
    img, txt = img_emb.float().cpu(), txt_emb.float().cpu()
    spans = _check_blocks(blocks, img.shape[0], txt.shape[0])
    out = torch.full((img.shape[0], txt.shape[0]), math.nan, dtype=torch.float32)
    for i0, i1, t0, t1 in spans:
        torch.matmul(img[i0:i1], txt[t0:t1].t(), out=out[i0:i1, t0:t1])
    return out


def mean_pooled_scores(
    regions: torch.Tensor,
    texts: TextTokens,
    *,
    blocks: Sequence[tuple[int, int, int, int]] | None = None,
) -> torch.Tensor:
    """The cosine of each image's mean region feature with each caption's mean word feature:
    a pair-scoring model's own two-tower score (cheap, no attention), used to shortlist."""
    img = F.normalize(regions.float().mean(dim=1), dim=-1)
    txt = F.normalize(texts.mean_pooled(), dim=-1)
    return embedding_scores(img, txt, blocks=blocks)


# -- approximate evaluation: shortlists re-ranked with exact scores ----------------------------


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
    blocks: Sequence[tuple[int, int, int, int]] | None = None,
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
    model_list, region_list, text_list = _members(models, regions, texts)
    n_img, n_txt = region_list[0].shape[0], len(text_list[0])
    if not isinstance(shortlist_sim, torch.Tensor) or shortlist_sim.shape != (n_img, n_txt):
        raise ValueError(f"shortlist_sim: expected a ({n_img}, {n_txt}) score matrix")
    device = _check_device(device)
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long).cpu()
    if t2i.shape != (n_txt,):
        raise ValueError(f"txt_to_img must have one entry per caption ({n_txt})")
    spans = _check_blocks(blocks, n_img, n_txt)
    plans = [_shortlist_plan(shortlist_sim, t2i, span, k) for span in spans]
    keys = torch.cat([plan[-1] for plan in plans]).unique()  # global pairs, sorted
    bar = _progress_bar(len(model_list) * keys.numel(), "scoring shortlisted pairs", progress)
    values = torch.zeros(keys.numel(), dtype=torch.float32)
    try:
        for model, reg, txt in zip(model_list, region_list, text_list, strict=True):
            values += _score_pairs(
                _unwrap(model), reg, txt, keys, device, text_block, max_elements, bar
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
    exact scores; the queries outside their shortlist are ranked ``tile`` rows at a time."""
    n_img = tt.shape[0]
    queries = torch.arange(shortlist.shape[0])
    if images_are_queries:
        is_gt = txt_to_img[shortlist] == queries[:, None]
        scores = tt  # rows = queries
    else:
        is_gt = shortlist == txt_to_img[:, None]
        scores = tt.t()
    inside = is_gt.any(dim=1)
    best = exact.masked_fill(~is_gt, -math.inf).amax(dim=1)
    ranks = ((exact >= best[:, None]) & ~is_gt).sum(dim=1)
    outside = torch.nonzero(~inside).squeeze(1)
    for a in range(0, outside.numel(), tile):
        q = outside[a : a + tile]
        row = scores.index_select(0, q)  # (c, n_cand)
        if images_are_queries:
            gt = txt_to_img[None, :] == q[:, None]
        else:
            gt = torch.arange(n_img)[None, :] == txt_to_img[q][:, None]
        best_tt = row.masked_fill(~gt, -math.inf).amax(dim=1, keepdim=True)
        beats = (row >= best_tt) & ~gt
        in_list = beats.gather(1, shortlist[q])
        ranks[q] = shortlist.shape[1] + beats.sum(dim=1) - in_list.sum(dim=1)
    return ranks, inside
