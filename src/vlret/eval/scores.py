"""Score matrices: blocks of pairs scored by pair-scoring models (SCAN, BFAN, SGRAF, CE, MMT),
two-tower dot products, and the metrics of a matrix (whole, or averaged over diagonal blocks:
the COCO 1K folds).

A pair-scoring model scores image blocks x caption blocks with ``model.score`` on the device
(:func:`score_matrix`); captions are scored in order of length, each caption block padded to its
own longest caption, and the scores land in a CPU float32 ``(N_img, N_txt)`` matrix. Only the
requested blocks are scored: the COCO 1K protocol scores the 5 diagonal fold blocks (5 x 1000 x
5000 pairs, not 5000 x 25000). Ensembles average the members' score matrices (the papers' "*"
rows: SCAN t2i + i2t, SGRAF = SGR + SAF).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._modules import unwrap_model
from .._progress import progress_bar
from ..metrics import RetrievalMetrics, average_metrics, retrieval_metrics_from_similarity
from .encode import TextTokens, check_device

#: ``(img0, img1, txt0, txt1)``: a block of a score matrix (the COCO 1K folds' diagonal blocks)
Block = tuple[int, int, int, int]
#: Default block of one ``model.score`` call: images x captions (memory inside the call is
#: bounded by the scorer's own ``max_elements``).
IMAGE_BLOCK = 128
TEXT_BLOCK = 1024


def check_blocks(blocks, n_img: int, n_txt: int) -> list[Block]:
    """``blocks`` checked: inside the matrix, not overlapping; ``None`` = the whole matrix."""
    if blocks is None:
        return [(0, n_img, 0, n_txt)]
    out: list[Block] = []
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


def members_of(models, regions, texts) -> tuple[list, list, list]:
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


def progress_pairs(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    return progress_bar(total=total, desc=desc, unit="pair", unit_scale=True, leave=False)


@torch.no_grad()
def score_matrix(
    models: nn.Module | Sequence[nn.Module],
    regions: torch.Tensor | Sequence[torch.Tensor],
    texts: TextTokens | Sequence[TextTokens],
    *,
    device: torch.device | str,
    blocks: Sequence[Block] | None = None,
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
    model_list, region_list, text_list = members_of(models, regions, texts)
    n = len(model_list)
    for name, v in (("image_block", image_block), ("text_block", text_block)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    device = check_device(device)
    n_img, n_txt = region_list[0].shape[0], len(text_list[0])
    spans = check_blocks(blocks, n_img, n_txt)
    out = torch.full((n_img, n_txt), math.nan, dtype=torch.float32)
    for i0, i1, t0, t1 in spans:
        out[i0:i1, t0:t1] = 0.0
    total = n * sum((i1 - i0) * (t1 - t0) for i0, i1, t0, t1 in spans)
    bar = progress_pairs(total, "scoring pairs", progress)
    try:
        for model, reg, txt in zip(model_list, region_list, text_list, strict=True):
            blocking = (device, image_block, text_block, max_elements, bar)
            _score_into(out, unwrap_model(model), reg, txt, spans, *blocking)
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


def metrics_from_scores(
    sim: torch.Tensor, txt_to_img, *, blocks: Sequence[Block] | None = None
) -> RetrievalMetrics:
    """Retrieval metrics of a score matrix; with ``blocks``
    (:func:`~vlret.metrics.fold_blocks`), each block's metrics (its captions must belong to
    its images) averaged as the COCO 1K protocol (:func:`~vlret.metrics.average_metrics`,
    per-fold results in ``.folds``)."""
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
    blocks: Sequence[Block] | None = None,
) -> torch.Tensor:
    """``(N_img, N_txt)`` float32 CPU dot products of two-tower embeddings (cosines when they
    are normalised), only inside ``blocks`` (NaN elsewhere); for ensembles and shortlists."""
    img, txt = img_emb.float().cpu(), txt_emb.float().cpu()
    spans = check_blocks(blocks, img.shape[0], txt.shape[0])
    out = torch.full((img.shape[0], txt.shape[0]), math.nan, dtype=torch.float32)
    for i0, i1, t0, t1 in spans:
        torch.matmul(img[i0:i1], txt[t0:t1].t(), out=out[i0:i1, t0:t1])
    return out


def mean_pooled_scores(
    regions: torch.Tensor,
    texts: TextTokens,
    *,
    blocks: Sequence[Block] | None = None,
) -> torch.Tensor:
    """The cosine of each image's mean region feature with each caption's mean word feature:
    a pair-scoring model's own two-tower score (cheap, no attention), used to shortlist."""
    img = F.normalize(regions.float().mean(dim=1), dim=-1)
    txt = F.normalize(texts.mean_pooled(), dim=-1)
    return embedding_scores(img, txt, blocks=blocks)


__all__ = [
    "IMAGE_BLOCK",
    "TEXT_BLOCK",
    "Block",
    "check_blocks",
    "embedding_scores",
    "mean_pooled_scores",
    "members_of",
    "progress_pairs",
    "metrics_from_scores",
    "score_matrix",
]
