"""Ranks and recall@K of the VSE lineage (VSE++, SCAN, VSE-infinity; the four papers' protocol).

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

:func:`retrieval_ranks` and :func:`retrieval_ranks_from_similarity` count both directions from
each tile (a caption's one image gives every column its threshold before the tile is scored),
so a two-tower model's COCO-5K scores are computed once for both; every other ranking (person
search, zero-shot classification, shortlists, re-scoring: :func:`retrieval_ranks_from_rows`,
the report) goes through the ranking core, :mod:`vlret.metrics.ranking`, under the same rule,
and the metrics below are its functions of the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch

from .._checks import check_finite
from .ranking import matrix_blocks, mean_rank, median_rank, rank_queries, recall_at_k, rsum
from .relevance_kinds import ImageOfCaption

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

    def format_table(self, title: str = "", *, visual: str = "image") -> str:
        """A one-row text table in the papers' column order; ``visual`` names the gallery side
        in the header (``"video"`` for MSR-VTT: ``video -> text | text -> video``)."""
        if visual not in ("image", "video"):
            raise ValueError(f"visual must be 'image' or 'video', got {visual!r}")
        head = "  R@1   R@5  R@10 |  R@1   R@5  R@10 |  rsum  | medr i2t/t2i"
        row = (
            f"{self.i2t_r1:5.1f} {self.i2t_r5:5.1f} {self.i2t_r10:5.1f} | "
            f"{self.t2i_r1:5.1f} {self.t2i_r5:5.1f} {self.t2i_r10:5.1f} | "
            f"{self.rsum:6.1f} | {self.i2t_medr:g}/{self.t2i_medr:g}"
        )
        lines = [title] if title else []
        lines += [f"   {visual} -> text   |   text -> {visual}   |", head, row]
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


def check_not_empty(t: torch.Tensor, name: str, what: str, dim: int = 0) -> None:
    """Refuse a matrix without ``what`` (its ``dim`` has size 0): one line naming ``name`` and
    its shape, not a reduction's error ("max() arg is an empty sequence") from deep inside."""
    if t.shape[dim] == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(t.shape)}): retrieval metrics need at least one {what}"
        )


def _check_finite(t: torch.Tensor, name: str) -> None:
    # A row's sum is finite only if the row is (NaN and inf propagate), and BLAS sums rows
    # vectorised on any CPU; isfinite(t).all() took a fifth of the COCO-5K matmul time. A sum
    # that is not finite (or overflowed) sends the matrix to the elementwise check.
    if t.numel() and not bool(torch.isfinite(torch.mv(t, t.new_ones(t.shape[1]))).all()):
        check_finite(t, name)


def _check_chunk(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _eval_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision scores change MSR-VTT R@1 by ~3 points; rank in float32 at least.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


#: Scores per tile: a chunk's rows against as many texts as fit in 2**25 scores (all 25k texts
#: of COCO-5K at chunk_size=1024). Each tile costs a few parallel ops (the matmul, two
#: comparisons, two sums), each waiting for every worker thread: on a 2-core EPYC shared with
#: other jobs, cache-sized tiles (2**21 scores) made the evaluation 15-60% slower than these,
#: and ~7% faster when the machine was idle.
_TILE_SCORES = 1 << 25
#: Sums of 0/1 in float32 are exact up to 2**24 ones; a longer tile side is counted in float64.
_FLOAT32_EXACT_COUNT = 1 << 24


def _spans(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _tile_shape(chunk_size: int, n_rows: int, n_cols: int) -> tuple[int, int]:
    """Rows and columns of a tile: ``chunk_size`` rows, and columns up to ``_TILE_SCORES``."""
    rows = max(1, min(chunk_size, n_rows))
    return rows, max(1, min(_TILE_SCORES // rows, n_cols))


def _positives(block: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive score of each column (its image is ``rows[j]``) and best positive of each row.

    (gather and index_select, not advanced indexing: on a CPU shared with other jobs,
    ``block[rows, cols]`` waited ~8 ms per call for its worker threads, these ~0.02 ms.)
    """
    pos = block.gather(0, rows[None, :]).squeeze(0)
    best = torch.full((block.shape[0],), -math.inf, dtype=block.dtype, device=block.device)
    best = best.scatter_reduce(0, rows, pos, reduce="amax")
    return pos, best


@dataclass
class _Scratch:
    """Reused buffers for counting: a tile of 0/1 hits and a vector of ones to sum them with."""

    hits: torch.Tensor
    ones: torch.Tensor

    @classmethod
    def make(cls, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> _Scratch:
        if dtype != torch.float64 and max(rows, cols) > _FLOAT32_EXACT_COUNT:
            dtype = torch.float64
        return cls(
            torch.empty(rows * cols, dtype=dtype, device=device),
            torch.ones(max(rows, cols), dtype=dtype, device=device),
        )


def _count_at_least(
    tile: torch.Tensor, best: torch.Tensor, pos: torch.Tensor, scratch: _Scratch
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: entries ``>= best[row]``; per column: entries ``>= pos[col]``.

    The comparisons write 0/1 in the tile's float dtype (a bool mask summed to int64 was ~6x
    slower) and a matrix-vector product with ones sums them: BLAS is vectorised on every CPU,
    also where ATen's own kernels run scalar. The sums are exact (``_FLOAT32_EXACT_COUNT``).
    """
    n_rows, n_cols = tile.shape
    hits = scratch.hits[: tile.numel()].view(tile.shape)
    torch.ge(tile, best[:, None], out=hits)
    row_counts = torch.mv(hits, scratch.ones[:n_cols]).to(torch.long)
    torch.ge(tile, pos[None, :], out=hits)
    col_counts = torch.mv(hits.t(), scratch.ones[:n_rows]).to(torch.long)
    return row_counts, col_counts


def _self_counts(pos: torch.Tensor, best: torch.Tensor, rows: torch.Tensor, n_rows: int):
    """What :func:`_count_at_least` counted of the matching pairs themselves, to subtract.

    A row counted its matching texts scoring ``>= best`` (those equal to the best, at least one);
    a column counted its own image (equal to ``pos``, exactly one).
    """
    at_best = (pos >= best.index_select(0, rows)).to(torch.long)
    return torch.zeros(n_rows, dtype=torch.long, device=pos.device).index_add_(0, rows, at_best)


def retrieval_ranks_from_similarity(
    sim: torch.Tensor, txt_to_img, *, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ``(i2t_ranks (N_img,), t2i_ranks (N_txt,))`` from an ``(N_img, N_txt)`` matrix.

    Half-precision scores are converted to float32 one tile at a time.
    """
    _check_chunk(chunk_size)
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2 or not sim.dtype.is_floating_point:
        raise ValueError("sim must be a 2-D floating-point tensor (N_img, N_txt)")
    check_not_empty(sim, "sim", "image (row)", 0)
    check_not_empty(sim, "sim", "text (column)", 1)
    _check_finite(sim, "sim")
    n_img, n_txt = sim.shape
    t2i = _check_txt_to_img(txt_to_img, n_img, n_txt, sim.device)
    dtype = _eval_dtype(sim.dtype)
    pos, best = _positives(sim, t2i)
    pos, best = pos.to(dtype), best.to(dtype)
    i2t = torch.zeros(n_img, dtype=torch.long, device=sim.device)
    t2i_rank = torch.zeros(n_txt, dtype=torch.long, device=sim.device)
    rows, width = _tile_shape(chunk_size, n_img, n_txt)
    scratch = _Scratch.make(rows, width, dtype, sim.device)
    converted = None if dtype == sim.dtype else sim.new_empty(rows * width, dtype=dtype)
    for r0, r1 in _spans(n_img, rows):
        for c0, c1 in _spans(n_txt, width):
            tile = sim[r0:r1, c0:c1]
            if converted is not None:
                tile = converted[: tile.numel()].view(tile.shape).copy_(tile)
            row_counts, col_counts = _count_at_least(tile, best[r0:r1], pos[c0:c1], scratch)
            i2t[r0:r1] += row_counts
            t2i_rank[c0:c1] += col_counts
    i2t -= _self_counts(pos, best, t2i, n_img)
    return i2t.cpu(), (t2i_rank - 1).cpu()


def retrieval_ranks_from_rows(
    img_rows: torch.Tensor, txt_rows: torch.Tensor, txt_to_img
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ``(i2t_ranks (N_img,), t2i_ranks (N_txt,))`` when each direction has its own
    scores (a re-scoring, :mod:`vlret.metrics.rescore`): the image queries rank the rows of
    ``img_rows (N_img, N_txt)``, the text queries the rows of ``txt_rows (N_txt, N_img)``; each
    counted once, by the ranking core (:func:`~vlret.metrics.rank_queries`)."""
    for name, t in (("img_rows", img_rows), ("txt_rows", txt_rows)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a 2-D floating-point tensor")
    check_not_empty(img_rows, "img_rows", "image (row)", 0)
    check_not_empty(img_rows, "img_rows", "text (column)", 1)
    n_img, n_txt = img_rows.shape
    if txt_rows.shape != (n_txt, n_img):
        raise ValueError(
            f"txt_rows must be ({n_txt}, {n_img}) (texts x images), got {tuple(txt_rows.shape)}"
        )
    t2i = _check_txt_to_img(txt_to_img, n_img, n_txt, img_rows.device)
    labels = {"txt_to_img": t2i, "n_images": n_img}
    i2t, t2i_ranks = (
        rank_queries(
            matrix_blocks(scores), ImageOfCaption(), labels, direction=d, n_queries=len(scores)
        ).first
        for d, scores in (("i2t", img_rows), ("t2i", txt_rows))
    )
    return i2t, t2i_ranks


def retrieval_ranks(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img, *, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ``(i2t_ranks (N_img,), t2i_ranks (N_txt,))`` with scores = dot products.

    Texts are grouped by image; images are processed ``chunk_size`` rows at a time. A first
    pass scores each image block against its own texts (which yields every positive score), a
    second pass scores it against all other texts, up to 2**25 scores at a time; both
    directions are counted from each tile. Each score is computed once, and no more than
    ``chunk_size x N_txt`` scores are held at once (plus as many 0/1 hits).
    """
    _check_chunk(chunk_size)
    for name, t in (("img_emb", img_emb), ("txt_emb", txt_emb)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a 2-D floating-point tensor (N, D)")
        check_not_empty(t, name, "image" if name == "img_emb" else "text")
        _check_finite(t, name)
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
    txt = txt_emb.to(device=device, dtype=dtype)
    # Texts grouped by image (already so in the usual data layouts: then no copy).
    grouped = n_txt < 2 or bool((t2i[1:] >= t2i[:-1]).all())
    order = None if grouped else torch.argsort(t2i, stable=True)
    if order is not None:
        txt = txt.index_select(0, order)
    img_of = t2i if order is None else t2i.index_select(0, order)
    offsets = [0] + torch.cumsum(torch.bincount(t2i, minlength=n_img), 0).tolist()

    pos = torch.empty(n_txt, dtype=dtype, device=device)
    best = torch.empty(n_img, dtype=dtype, device=device)
    i2t = torch.zeros(n_img, dtype=torch.long, device=device)
    t2i_sorted = torch.zeros(n_txt, dtype=torch.long, device=device)
    rows, width = _tile_shape(chunk_size, n_img, n_txt)
    blocks = _spans(n_img, rows)
    own_width = max(offsets[r1] - offsets[r0] for r0, r1 in blocks)
    tiles = torch.empty(rows * max(width, own_width), dtype=dtype, device=device)
    scratch = _Scratch.make(rows, max(width, own_width), dtype, device)

    def score(r0: int, r1: int, t0: int, t1: int) -> torch.Tensor:
        out = tiles[: (r1 - r0) * (t1 - t0)].view(r1 - r0, t1 - t0)
        return torch.matmul(img[r0:r1], txt[t0:t1].t(), out=out)

    # Pass 1: each image block against its own texts.
    for r0, r1 in blocks:
        t0, t1 = offsets[r0], offsets[r1]
        block = score(r0, r1, t0, t1)
        own = img_of[t0:t1] - r0
        p, b = _positives(block, own)
        pos[t0:t1], best[r0:r1] = p, b
        row_counts, col_counts = _count_at_least(block, b, p, scratch)
        i2t[r0:r1] += row_counts - _self_counts(p, b, own, r1 - r0)
        t2i_sorted[t0:t1] += col_counts - 1

    # Pass 2: each image block against the texts before and after its own, tile by tile.
    for r0, r1 in blocks:
        for s0, s1 in ((0, offsets[r0]), (offsets[r1], n_txt)):
            for t0, t1 in _spans(s1 - s0, width):
                t0, t1 = t0 + s0, t1 + s0
                row_counts, col_counts = _count_at_least(
                    score(r0, r1, t0, t1), best[r0:r1], pos[t0:t1], scratch
                )
                i2t[r0:r1] += row_counts
                t2i_sorted[t0:t1] += col_counts

    if order is None:
        return i2t.cpu(), t2i_sorted.cpu()
    return i2t.cpu(), torch.empty_like(t2i_sorted).index_copy_(0, order, t2i_sorted).cpu()


def metrics_from_ranks(i2t_ranks: torch.Tensor, t2i_ranks: torch.Tensor) -> RetrievalMetrics:
    """Recall@{1,5,10} (percent), rsum, medr and meanr from 0-based ranks."""
    values: dict[str, Any] = {}  # floats, as RetrievalMetrics's keyword arguments
    for prefix, ranks in (("i2t", i2t_ranks), ("t2i", t2i_ranks)):
        r = np.asarray(torch.as_tensor(ranks).cpu(), dtype=np.float64)
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"{prefix}_ranks must be a non-empty 1-D array")
        for k in (1, 5, 10):
            values[f"{prefix}_r{k}"] = recall_at_k(r, k)
        values[f"{prefix}_medr"] = median_rank(r)
        values[f"{prefix}_meanr"] = mean_rank(r)
    values["rsum"] = rsum(values, RECALL_KEYS)
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


@dataclass(frozen=True, eq=False)
class Fold:
    """One fold of the COCO 1K protocol: the images ``img0:img1`` and their texts."""

    img0: int
    img1: int
    #: indices of the texts whose image lies in ``img0:img1``, in text order
    texts: torch.Tensor

    def block(self) -> tuple[int, int, int, int]:
        """``(img0, img1, txt0, txt1)``: the fold as one diagonal block of a score matrix; its
        texts must be contiguous (texts grouped by image, as in every supported data layout)."""
        t = self.texts
        if t.numel() and int(t[-1]) - int(t[0]) + 1 != t.numel():
            raise ValueError(
                "txt_to_img: the folds need captions grouped by image (non-decreasing) to be "
                "scored as diagonal blocks"
            )
        t0 = int(t[0]) if t.numel() else 0
        return (self.img0, self.img1, t0, t0 + int(t.numel()))


def _check_count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def coco_folds(txt_to_img: Any, *, n_images: int, n_folds: int = 5) -> list[Fold]:
    """The folds of the MS-COCO 1K protocol: ``n_folds`` contiguous, equal ranges of images,
    each with every text of its images (COCO testall: 5 folds of 1000 images). The one fold
    rule: :func:`coco_5fold_metrics` and :func:`fold_blocks` both fold ``n_images`` images
    (the embeddings' rows, the split's images), each of which has a text."""
    _check_count(n_folds, "n_folds")
    _check_count(n_images, "n_images")
    if n_images % n_folds:
        # the protocol layer words this for its users (EvalProtocol.check_folds)
        raise ValueError(
            f"n_folds: {n_folds} folds of equal size need n_images divisible by {n_folds}; "
            f"got {n_images} images, not divisible by {n_folds}"
        )
    t2i = torch.as_tensor(txt_to_img)
    size = n_images // n_folds
    folds = []
    for f in range(n_folds):
        in_fold = (t2i >= f * size) & (t2i < (f + 1) * size)
        folds.append(Fold(f * size, (f + 1) * size, torch.nonzero(in_fold).squeeze(1)))
    return folds


def fold_blocks(
    txt_to_img: Any, n_folds: int, *, n_images: int | None = None
) -> list[tuple[int, int, int, int]]:
    """The COCO 1K folds (:func:`coco_folds`) of ``n_images`` images (default: the images
    ``txt_to_img`` names) as the diagonal blocks ``(img0, img1, txt0, txt1)`` of a score
    matrix (captions grouped by image). Every image needs a text, as in
    :func:`coco_5fold_metrics`, so both fold the same images on every input they accept."""
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long).cpu()
    if t2i.dim() != 1 or t2i.numel() == 0:
        raise ValueError("txt_to_img must be a non-empty 1-D integer tensor")
    if n_images is not None:
        _check_count(n_images, "n_images")
    n = int(t2i.max()) + 1 if n_images is None else n_images
    t2i = _check_txt_to_img(t2i, n, t2i.numel(), t2i.device)
    if bool((t2i[1:] < t2i[:-1]).any()):
        raise ValueError("txt_to_img: the folds need captions grouped by image (non-decreasing)")
    return [f.block() for f in coco_folds(t2i, n_images=n, n_folds=n_folds)]


def coco_5fold_metrics(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    txt_to_img,
    *,
    n_folds: int = 5,
    chunk_size: int = 1024,
) -> RetrievalMetrics:
    """MS-COCO 1K protocol: the folds of :func:`coco_folds` (1000 images each for COCO
    testall's 5000, each with its own texts); metrics averaged over the folds (see
    :func:`average_metrics`). The per-fold results are in ``.folds``.
    """
    if not isinstance(img_emb, torch.Tensor) or img_emb.dim() != 2:
        raise ValueError("img_emb must be a 2-D tensor (N_img, D)")
    if not isinstance(txt_emb, torch.Tensor) or txt_emb.dim() != 2:
        raise ValueError("txt_emb must be a 2-D tensor (N_txt, D)")
    check_not_empty(img_emb, "img_emb", "image")
    check_not_empty(txt_emb, "txt_emb", "text")
    n_img = img_emb.shape[0]
    t2i = _check_txt_to_img(txt_to_img, n_img, txt_emb.shape[0], img_emb.device)
    folds = []
    for fold in coco_folds(t2i, n_images=n_img, n_folds=n_folds):
        idx = fold.texts
        folds.append(
            retrieval_metrics(
                img_emb[fold.img0 : fold.img1],
                txt_emb.index_select(0, idx.to(txt_emb.device)),
                t2i[idx] - fold.img0,
                chunk_size=chunk_size,
            )
        )
    return average_metrics(folds)


__all__ = [
    "RECALL_KEYS",
    "Fold",
    "RetrievalMetrics",
    "average_metrics",
    "coco_5fold_metrics",
    "coco_folds",
    "fold_blocks",
    "metrics_from_ranks",
    "retrieval_metrics",
    "retrieval_metrics_from_similarity",
    "retrieval_ranks",
    "retrieval_ranks_from_rows",
    "retrieval_ranks_from_similarity",
]
