"""Retrieval metrics of the VSE lineage (VSE++, SCAN, VSE-infinity; the four papers' protocol).

Definitions (0-based ranks, scores as computed, **ties count against the query**):

* i2t rank of image ``i``: the number of non-matching texts scoring ``>=`` its best-scoring
  matching text.
* t2i rank of text ``j``: the number of non-matching images scoring ``>=`` its own image.
* ``R@K`` = 100 x the fraction of ranks ``< K``; ``medr`` = floor(median rank) + 1;
  ``meanr`` = mean rank + 1; ``rsum`` = the sum of the six recalls.

Because ties count against the query, a collapsed model whose scores are all equal ranks every
query last, never first. Ranks are computed by counting, not sorting, from score blocks of at
most ``chunk_size x N`` entries, and every score is computed exactly once, so ties are decided on
one consistent set of numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch

from ._checks import check_finite

RECALL_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")


@dataclass(frozen=True)
class RetrievalMetrics:
    """Recall@K in percent, rsum, and median / mean rank (1-based) in both directions."""

    i2t_r1: float
    i2t_r5: float
    i2t_r10: float
    t2i_r1: float
    t2i_r5: float
    t2i_r10: float
    rsum: float
    i2t_medr: float
    t2i_medr: float
    i2t_meanr: float
    t2i_meanr: float
    #: Per-fold metrics for a folded protocol (COCO 5-fold 1K); empty otherwise.
    folds: tuple[RetrievalMetrics, ...] = field(default=(), repr=False, compare=False)

    def as_dict(self) -> dict[str, float]:
        """The metric values by name (without the folds)."""
        d = asdict(self)
        d.pop("folds")
        return d

    def __getitem__(self, key: str) -> float:
        if key == "folds" or key not in {f.name for f in fields(self)}:
            raise KeyError(key)
        return getattr(self, key)

    def format_table(self, title: str = "") -> str:
        """A one-row text table in the papers' column order."""
        head = "  R@1   R@5  R@10 |  R@1   R@5  R@10 |  rsum  | medr i2t/t2i"
        row = (
            f"{self.i2t_r1:5.1f} {self.i2t_r5:5.1f} {self.i2t_r10:5.1f} | "
            f"{self.t2i_r1:5.1f} {self.t2i_r5:5.1f} {self.t2i_r10:5.1f} | "
            f"{self.rsum:6.1f} | {self.i2t_medr:g}/{self.t2i_medr:g}"
        )
        lines = [title] if title else []
        lines += ["   image -> text   |   text -> image   |", head, row]
        return "\n".join(lines)


def _check_txt_to_img(txt_to_img, n_img: int, n_txt: int, device: torch.device) -> torch.Tensor:
    if not isinstance(txt_to_img, torch.Tensor):
        if isinstance(txt_to_img, str) or not isinstance(txt_to_img, Sequence | np.ndarray):
            raise ValueError(f"txt_to_img must be a 1-D integer tensor, got {type(txt_to_img)}")
        txt_to_img = torch.as_tensor(np.asarray(txt_to_img))
    if (
        txt_to_img.dim() != 1
        or txt_to_img.dtype.is_floating_point
        or txt_to_img.dtype == torch.bool
    ):
        raise ValueError(
            "txt_to_img must be a 1-D integer tensor (the image index of each text), got "
            f"shape {tuple(txt_to_img.shape)} dtype {txt_to_img.dtype}"
        )
    if txt_to_img.numel() != n_txt:
        raise ValueError(
            f"txt_to_img must have one entry per text ({n_txt}), got {txt_to_img.numel()}"
        )
    t2i = txt_to_img.to(device=device, dtype=torch.long)
    if n_txt and (int(t2i.min()) < 0 or int(t2i.max()) >= n_img):
        raise ValueError(f"txt_to_img values must lie in [0, {n_img}), the number of images")
    counts = torch.bincount(t2i, minlength=n_img)
    if bool((counts == 0).any()):
        missing = int(torch.nonzero(counts == 0)[0])
        raise ValueError(
            f"txt_to_img gives image {missing} no text; every image needs at least one text "
            "for image->text ranks"
        )
    return t2i


def _check_chunk(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _eval_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision scores change MSR-VTT R@1 by ~3 points; rank in float32 at least.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _positives(block: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive score of each column (its image is ``rows[j]``) and best positive of each row."""
    cols = torch.arange(block.shape[1], device=block.device)
    pos = block[rows, cols]
    best = torch.full((block.shape[0],), -math.inf, dtype=block.dtype, device=block.device)
    best = best.scatter_reduce(0, rows, pos, reduce="amax")
    return pos, best


def _count_at_least(
    block: torch.Tensor, best: torch.Tensor, pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: entries ``>= best[row]``; per column: entries ``>= pos[col]``."""
    return (block >= best[:, None]).sum(1), (block >= pos[None, :]).sum(0)


def _self_counts(pos: torch.Tensor, best: torch.Tensor, rows: torch.Tensor, n_rows: int):
    """What :func:`_count_at_least` counted of the matching pairs themselves, to subtract.

    A row counted its matching texts scoring ``>= best`` (those equal to the best, at least one);
    a column counted its own image (equal to ``pos``, exactly one).
    """
    at_best = (pos >= best[rows]).to(torch.long)
    return torch.zeros(n_rows, dtype=torch.long, device=pos.device).index_add_(0, rows, at_best)


def retrieval_ranks_from_similarity(
    sim: torch.Tensor, txt_to_img, *, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ``(i2t_ranks (N_img,), t2i_ranks (N_txt,))`` from an ``(N_img, N_txt)`` matrix."""
    _check_chunk(chunk_size)
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2 or not sim.dtype.is_floating_point:
        raise ValueError("sim must be a 2-D floating-point tensor (N_img, N_txt)")
    check_finite(sim, "sim")
    n_img, n_txt = sim.shape
    t2i = _check_txt_to_img(txt_to_img, n_img, n_txt, sim.device)
    sim = sim.to(_eval_dtype(sim.dtype))
    pos, best = _positives(sim, t2i)
    i2t = torch.zeros(n_img, dtype=torch.long, device=sim.device)
    t2i_rank = torch.zeros(n_txt, dtype=torch.long, device=sim.device)
    for r0 in range(0, n_img, chunk_size):
        r1 = min(r0 + chunk_size, n_img)
        rows, cols = _count_at_least(sim[r0:r1], best[r0:r1], pos)
        i2t[r0:r1] += rows
        t2i_rank += cols
    i2t -= _self_counts(pos, best, t2i, n_img)
    return i2t.cpu(), (t2i_rank - 1).cpu()


def retrieval_ranks(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img, *, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ``(i2t_ranks (N_img,), t2i_ranks (N_txt,))`` with scores = dot products.

    Texts are grouped by image; images are processed ``chunk_size`` rows at a time. A first
    pass scores each image block against its own texts (which yields every positive score), a
    second pass scores it against all other texts. Each score is computed once, and no more than
    ``chunk_size x N_txt`` scores are held at once.
    """
    _check_chunk(chunk_size)
    for name, t in (("img_emb", img_emb), ("txt_emb", txt_emb)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a 2-D floating-point tensor (N, D)")
        check_finite(t, name)
    if img_emb.shape[1] != txt_emb.shape[1]:
        raise ValueError(
            f"img_emb and txt_emb must share the embedding size, got {img_emb.shape[1]} "
            f"and {txt_emb.shape[1]}"
        )
    n_img, n_txt = img_emb.shape[0], txt_emb.shape[0]
    device = img_emb.device
    t2i = _check_txt_to_img(txt_to_img, n_img, n_txt, device)
    dtype = _eval_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
    img = img_emb.to(dtype)
    order = torch.argsort(t2i, stable=True)
    txt = txt_emb.to(device=device, dtype=dtype)[order]
    img_of = t2i[order]
    offsets = [0] + torch.cumsum(torch.bincount(t2i, minlength=n_img), 0).tolist()

    pos = torch.empty(n_txt, dtype=dtype, device=device)
    best = torch.empty(n_img, dtype=dtype, device=device)
    i2t = torch.zeros(n_img, dtype=torch.long, device=device)
    t2i_sorted = torch.zeros(n_txt, dtype=torch.long, device=device)
    blocks = [(r0, min(r0 + chunk_size, n_img)) for r0 in range(0, n_img, chunk_size)]

    # Pass 1: each image block against its own texts.
    for r0, r1 in blocks:
        t0, t1 = offsets[r0], offsets[r1]
        block = img[r0:r1] @ txt[t0:t1].t()
        rows = img_of[t0:t1] - r0
        p, b = _positives(block, rows)
        pos[t0:t1], best[r0:r1] = p, b
        row_counts, col_counts = _count_at_least(block, b, p)
        i2t[r0:r1] += row_counts - _self_counts(p, b, rows, r1 - r0)
        t2i_sorted[t0:t1] += col_counts - 1

    # Pass 2: each image block against the texts before and after its own.
    for r0, r1 in blocks:
        for t0, t1 in ((0, offsets[r0]), (offsets[r1], n_txt)):
            if t1 <= t0:
                continue
            block = img[r0:r1] @ txt[t0:t1].t()
            row_counts, col_counts = _count_at_least(block, best[r0:r1], pos[t0:t1])
            i2t[r0:r1] += row_counts
            t2i_sorted[t0:t1] += col_counts

    t2i_rank = torch.empty_like(t2i_sorted)
    t2i_rank[order] = t2i_sorted
    return i2t.cpu(), t2i_rank.cpu()


def metrics_from_ranks(i2t_ranks: torch.Tensor, t2i_ranks: torch.Tensor) -> RetrievalMetrics:
    """Recall@{1,5,10} (percent), rsum, medr and meanr from 0-based ranks."""
    values: dict[str, float] = {}
    for prefix, ranks in (("i2t", i2t_ranks), ("t2i", t2i_ranks)):
        r = np.asarray(torch.as_tensor(ranks).cpu(), dtype=np.float64)
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"{prefix}_ranks must be a non-empty 1-D array")
        for k in (1, 5, 10):
            values[f"{prefix}_r{k}"] = 100.0 * float(np.mean(r < k))
        values[f"{prefix}_medr"] = float(np.floor(np.median(r)) + 1)
        values[f"{prefix}_meanr"] = float(r.mean() + 1)
    values["rsum"] = sum(values[k] for k in RECALL_KEYS)
    return RetrievalMetrics(**values)


def retrieval_metrics(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img, *, chunk_size: int = 1024
) -> RetrievalMetrics:
    """Image->text and text->image metrics with scores = dot products of the embeddings.

    ``txt_to_img[j]`` is the image index of text ``j``; any number (>= 1) of texts per image.
    Callers normalise the embeddings for cosine similarity. Half-precision embeddings are
    scored in float32. Memory is bounded by ``chunk_size x N_txt`` scores.
    """
    return metrics_from_ranks(*retrieval_ranks(img_emb, txt_emb, txt_to_img, chunk_size=chunk_size))


def retrieval_metrics_from_similarity(
    sim: torch.Tensor, txt_to_img, *, chunk_size: int = 1024
) -> RetrievalMetrics:
    """Metrics from a precomputed ``(N_img, N_txt)`` score matrix (cross-attention models)."""
    ranks = retrieval_ranks_from_similarity(sim, txt_to_img, chunk_size=chunk_size)
    return metrics_from_ranks(*ranks)


def average_metrics(folds: Sequence[RetrievalMetrics]) -> RetrievalMetrics:
    """Average each metric over folds; ``rsum`` is the sum of the averaged recalls.

    (Not 6 x the mean image->text recall, nor 6 x the mean rsum, as several public codes print.)
    """
    if not folds:
        raise ValueError("folds must not be empty")
    means = {k: float(np.mean([f[k] for f in folds])) for k in folds[0].as_dict() if k != "rsum"}
    means["rsum"] = sum(means[k] for k in RECALL_KEYS)
    return RetrievalMetrics(**means, folds=tuple(folds))


def coco_5fold_metrics(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    txt_to_img,
    *,
    n_folds: int = 5,
    chunk_size: int = 1024,
) -> RetrievalMetrics:
    """MS-COCO 1K protocol: ``n_folds`` contiguous folds of images (1000 each for COCO testall's
    5000), each with its own texts; metrics averaged over the folds (see :func:`average_metrics`).
    The per-fold results are in ``.folds``.
    """
    if not isinstance(img_emb, torch.Tensor) or img_emb.dim() != 2:
        raise ValueError("img_emb must be a 2-D tensor (N_img, D)")
    n_img = img_emb.shape[0]
    if n_folds < 1 or n_img % n_folds:
        raise ValueError(
            f"the number of images ({n_img}) must divide into n_folds={n_folds} equal folds"
        )
    t2i = _check_txt_to_img(txt_to_img, n_img, txt_emb.shape[0], img_emb.device)
    size = n_img // n_folds
    folds = []
    for f in range(n_folds):
        in_fold = (t2i >= f * size) & (t2i < (f + 1) * size)
        idx = torch.nonzero(in_fold).squeeze(1)
        folds.append(
            retrieval_metrics(
                img_emb[f * size : (f + 1) * size],
                txt_emb[idx.to(txt_emb.device)],
                t2i[idx] - f * size,
                chunk_size=chunk_size,
            )
        )
    return average_metrics(folds)
