"""AOQ's offline candidates (Chen et al., ECCV 2020): each image's top-K captions and each
caption's top-K images over a whole split, by a trained model's scores, own positives excluded
(``vlret mine-negatives``; the file format is :mod:`vlret.data.offline_negatives`).

The split is scored in blocks of captions x all images, never as one ``(N_img, N_txt)`` matrix.
Selection is exact through integer keys: a float32 score maps to a 32-bit integer in the same
order (``-0.0`` as ``0.0``) and an entry's key (score, then index) is unique, so one integer
sort or partition orders by higher score then lower index, with no tie pass, whatever the
blocks. On the CPU (numpy's vectorised sort and partition):

* a caption's top K images: a threshold from a strided sample of its row (about 1.45 K entries
  at or above it), one comparison pass, a sort of the keys of the entries that pass; a row left
  with fewer than K is redone from a partition to its exact K-th best;
* an image's top K captions: each image has a floor below which no caption can enter (a guess
  from the first block, then its K-th best so far); a block's entries at or above it are kept
  (up to 2K per image, then a partition back to K). An image whose K-th best ends below its
  guess is rescored whole;
* a two-tower model's blocks come in a fixed random order (the first is a fair sample) and
  ``workers`` threads score and select them side by side, one BLAS thread each.

On an accelerator each block's keys go through ``topk``. A pair-scoring model is scored by the
evaluation's pair scorer (:func:`vlret.eval.score_matrix`), block by block, in order, no guess.
The release mined with a two-tower first-round model (VSRN's global similarity), also for BFAN.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .._progress import progress_bar
from ..data.offline_negatives import OfflineNegatives
from ..eval import TextTokens, score_matrix

#: Captions per scored block (a block is ``BLOCK x N_img`` float32 scores).
BLOCK = 1024
#: AOQ's default number of candidates (the release draws among the top 300).
DEFAULT_K = 300

_LOW31 = (1 << 31) - 1
#: CPU blocks hold at most this many scores per worker (fewer captions for a large gallery).
_BLOCK_ENTRIES = 1 << 24
#: A key worse than every entry's (an empty slot, an excluded entry).
_NONE = int(np.iinfo(np.int64).max)
#: t2i: the sampled threshold leaves about this many times ``k`` entries per row.
_ROW_SLACK = 1.45
#: i2t: the first block's guess leaves about this many times ``k`` captions per image.
_IMAGE_SLACK = 2.0


def _flip(x: Any) -> Any:  # int32 torch or numpy: negatives' magnitude bits turned over
    return x ^ (~(x >> 31) & _LOW31)


def _desc_t(values: torch.Tensor) -> torch.Tensor:
    """Float32 scores as int64 in ``[0, 2**32)``, smaller for a higher score, in the scores'
    order (``-0.0`` as ``0.0``): the bits with the sign's meaning turned over."""
    return _flip((values.float() + 0.0).view(torch.int32)).long() & 0xFFFFFFFF


def _undesc_t(desc: torch.Tensor) -> torch.Tensor:
    return _flip(desc.int()).view(torch.float32)


def _desc(v: np.ndarray) -> np.ndarray:  # _desc_t in numpy
    return _flip((v + np.float32(0.0)).view(np.int32)).view(np.uint32).astype(np.int64)


def _undesc(desc: np.ndarray) -> np.ndarray:
    return _flip(desc.astype(np.uint32).view(np.int32)).view(np.float32)


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def top_k(values: torch.Tensor, k: int, ids: torch.Tensor | None = None):
    """``(scores, ids)`` of the ``k`` best entries of each row of ``values`` (at most its width),
    ordered by score (descending) then id (ascending), ``-inf`` included; ``ids`` (same shape,
    in ``[0, 2**31)``, default the column positions) name the entries. Each entry's key
    ``desc(score) << 31 | id`` is unique, so one integer ``topk`` gives this order exactly."""
    if bool(torch.isnan(values).any()):
        raise ValueError("the model's scores contain NaN")
    if ids is None:
        ids = torch.arange(values.shape[1], device=values.device).expand(values.shape)
    keys = (_desc_t(values) << 31) | ids
    best = keys.topk(min(k, values.shape[1]), dim=1, largest=False).values
    return _undesc_t(best >> 31), best & _LOW31


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


def _first_k(f, row, desc, n_rows: int, width: int, k: int):
    """The best ``k`` entries (flat positions ``f`` in a C-order matrix of ``width`` columns,
    their rows, ``desc``) of each of ``n_rows`` rows, as ``(columns, scores, entries per
    row)``: one sort of the keys ``row | desc | col``. A row with fewer than ``k`` entries gets
    others' (redo it)."""
    if len(row) == 0:
        zeros = np.zeros(n_rows, np.int64)
        return np.zeros((n_rows, k), np.int64), np.zeros((n_rows, k), np.float32), zeros
    bw = _bits(width)
    key = row * ((1 << (32 + bw)) - width)  # + f: row << (32 + bw) | col
    key += f
    key |= desc << bw
    key.sort()
    starts = np.searchsorted(key, np.arange(n_rows + 1) << (32 + bw))
    counts = np.diff(starts)
    at = np.minimum(starts[:-1, None] + np.arange(k), len(key) - 1)
    best = key[at]
    return best & ((1 << bw) - 1), _undesc((best >> bw) & 0xFFFFFFFF), counts


def _exact_rows(s: np.ndarray, k: int, own: np.ndarray):
    """The best ``k`` of each row of ``s`` (float32, C order; set to ``-inf`` at the flat
    positions ``own``, which are never chosen): a partition to each row's ``k``-th best score,
    then :func:`_first_k` of the entries at or above it (at least ``k`` per row)."""
    rows, width = s.shape
    flat = s.reshape(-1)
    flat[own] = -np.inf
    thr = np.partition(s, width - k, axis=1)[:, width - k]
    mask = s >= thr[:, None]
    mask.reshape(-1)[own] = False
    f = np.flatnonzero(mask)
    return _first_k(f, f // width, _desc(flat[f]), rows, width, k)[:2]


def _thresholds(s: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``s``, a score with about ``_ROW_SLACK * k`` of the row at or above it: the
    ``r``-th best of every ``step``-th column (``r`` about 48, so fewer than ``k`` is rare; such
    rows are redone exactly). With ``step`` 1 it is the ``r``-th best of the row, ``r >= k``."""
    width = s.shape[1]
    step = max(1, int(_ROW_SLACK * k / 48))
    sample = s[:, ::step]
    m = sample.shape[1]
    r = min(m, max(1, round(_ROW_SLACK * k * m / width)))
    return np.partition(sample, m - r, axis=1)[:, m - r]


class _Images:
    """The kept captions of every image: up to ``2k`` keys ``desc << 31 | caption`` per image
    (unordered), and ``floor``, the score below which a caption cannot enter: the ``k``-th
    best kept (a lower bound of the true ``k``-th best), or the first block's guess. Workers
    share it (``add`` holds a lock); a floor read while it rises is valid either way."""

    def __init__(self, n_images: int, k: int, floor: np.ndarray) -> None:
        self.k = k
        self.keys = np.full((n_images, 2 * k), _NONE, dtype=np.int64)
        self.fill = np.zeros(n_images, dtype=np.int64)
        self.floor = floor.astype(np.float32)
        self.lock = threading.Lock()

    def add(self, image, desc, row, captions: np.ndarray) -> None:
        """Keep the entries ``(image, desc, row)`` of a block of ``captions`` (rows)."""
        if len(image) == 0:
            return
        k, bc = self.k, _bits(len(captions))
        key = (image << (32 + bc)) | (desc << bc) | row
        key.sort()  # by image, then best first
        image = key >> (32 + bc)
        counts = np.bincount(image, minlength=len(self.fill))
        starts = np.cumsum(counts) - counts
        if counts.max() > k:  # only a block's best k of an image can matter
            keep = np.arange(len(key)) - starts[image] < k
            key, image = key[keep], image[keep]
            counts = np.minimum(counts, k)
            starts = np.cumsum(counts) - counts
        glob = (((key >> bc) & 0xFFFFFFFF) << 31) | captions[key & ((1 << bc) - 1)]
        with self.lock:
            full = np.flatnonzero(self.fill + counts > 2 * k)
            if len(full):
                self.compact(full)
            # the slots fill[image] + rank of each image's row, as flat positions
            base = np.arange(len(self.fill)) * (2 * k) + self.fill - starts
            self.keys.reshape(-1)[base[image] + np.arange(len(key))] = glob
            self.fill += counts

    def compact(self, images: np.ndarray) -> None:
        """Keep the best ``k`` of ``images`` (each holds more) and raise their floors."""
        k = self.k
        part = np.partition(self.keys[images], k - 1, axis=1)
        part[:, k:] = _NONE
        self.keys[images], self.fill[images] = part, k
        self.floor[images] = np.maximum(self.floor[images], _undesc(part[:, k - 1] >> 31))


def _merge_images(images: _Images, k: int, guess: np.ndarray, chunk: int = 4096):
    """Every image's best ``k`` kept captions: ``(ids, scores, failed)``, ``failed`` the images
    whose ``k``-th best is below their guess (a caption under the guess was never kept, so it
    may belong) or that kept fewer than ``k``."""
    n = len(guess)
    ids, scores = np.empty((n, k), np.int64), np.empty((n, k), np.float32)
    short = np.zeros(n, dtype=bool)
    for a in range(0, n, chunk):
        best = np.sort(np.partition(images.keys[a : a + chunk], k - 1, axis=1)[:, :k], axis=1)
        ids[a : a + chunk], scores[a : a + chunk] = best & _LOW31, _undesc(best >> 31)
        short[a : a + chunk] = best[:, -1] == _NONE
    return ids, scores, np.flatnonzero(short | (scores[:, -1] < guess))


def _block(
    s: np.ndarray,
    captions: np.ndarray,
    t2img: np.ndarray,
    k: int,
    images: _Images,
    t2i: tuple[np.ndarray, np.ndarray],
    check_nan: bool,
) -> None:
    """Mine one block: ``s`` (float32 ``(c, n_images)``, C order, modified) scores the
    ``captions`` against every image. One comparison pass marks the entries at or above their
    row's threshold or their image's floor; the marked ones (about ``_ROW_SLACK * k`` per row
    plus the few that can enter an image's list) are the only ones sorted."""
    c, n = s.shape
    flat = s.reshape(-1)
    if check_nan and bool(np.isnan(flat).any()):
        raise ValueError("the model's scores contain NaN")
    own = np.arange(c) * n + t2img[captions]
    flat[own] = -np.inf
    thr = _thresholds(s, k)
    mask = np.greater_equal(s, thr[:, None])
    enter = np.greater_equal(s, images.floor).reshape(-1)
    mask.reshape(-1)[own] = enter[own] = False
    mask |= enter.reshape(c, n)
    f = np.flatnonzero(mask)
    row = f // n
    desc = _desc(flat[f])
    cols, scores, counts = _first_k(f, row, desc, c, n, k)
    # fewer than k at or above the sampled threshold: redo those rows exactly
    bad = np.flatnonzero((counts < k) | (scores[:, -1] < thr))
    if len(bad):
        cols[bad], scores[bad] = _exact_rows(s[bad], k, np.arange(len(bad)) * n + own[bad] % n)
    t2i[0][captions], t2i[1][captions] = cols, scores
    e = np.flatnonzero(enter[f])
    images.add(f[e] - row[e] * n, desc[e], row[e], captions)


def _scored(score_block, t0: int, t1: int, n_images: int, dev: torch.device) -> torch.Tensor:
    s = score_block(t0, t1)
    if tuple(s.shape) != (t1 - t0, n_images):
        raise ValueError(
            f"score_block({t0}, {t1}): expected shape {(t1 - t0, n_images)}, got {tuple(s.shape)}"
        )
    s = s.detach().to(device=dev, dtype=torch.float32)
    if bool(torch.isnan(s).any()):
        raise ValueError(f"the model's scores of captions {t0}:{t1} contain NaN")
    return s


def _result(i2t, i2t_scores, t2i, t2i_scores, t2img, k: int) -> OfflineNegatives:
    i2t, t2i, t2img = (np.asarray(a, dtype=np.int64) for a in (i2t, t2i, t2img))
    i2t_scores, t2i_scores = (np.asarray(a, dtype=np.float32) for a in (i2t_scores, t2i_scores))
    return OfflineNegatives(
        i2t, t2i, i2t_scores, t2i_scores, t2img, {"k": k, "ties": "lower index first"}
    )


def _checked_block_size(block_size: int, n_images: int) -> int:
    _positive("block_size", block_size)
    return min(block_size, 1 << (31 - _bits(n_images)))  # keys: row | score | image in 63 bits


def _mine_on_device(score_block, n_images: int, t2img: torch.Tensor, k: int, block: int, dev, bar):
    """The accelerator's way (any device): integer keys and ``topk`` per block, each image's
    best merged with every block."""
    n_txt, t2img_dev, images = len(t2img), t2img.to(dev), torch.arange(n_images, device=dev)
    best = torch.full((n_images, k), _NONE, dtype=torch.long, device=dev)
    t2i, t2i_scores = torch.empty(n_txt, k, dtype=torch.long), torch.empty(n_txt, k)
    for t0 in range(0, n_txt, block):
        t1 = min(t0 + block, n_txt)
        s = _scored(score_block, t0, t1, n_images, dev)
        rows, own = torch.arange(t1 - t0, device=dev), t2img_dev[t0:t1]
        desc = _desc_t(s) << 31
        keys = desc | images
        keys[rows, own] = _NONE
        sel = keys.topk(k, dim=1, largest=False).values
        t2i[t0:t1], t2i_scores[t0:t1] = (sel & _LOW31).cpu(), _undesc_t(sel >> 31).cpu()
        keys = desc | (rows + t0)[:, None]
        keys[rows, own] = _NONE
        best = torch.cat([best, keys.t()], dim=1).topk(k, dim=1, largest=False).values
        bar.update(t1 - t0)
    best = best.cpu()
    return _result(best & _LOW31, _undesc_t(best >> 31), t2i, t2i_scores, t2img, k)


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
    block = _checked_block_size(block_size, n_images)
    dev, n_txt = torch.device(device), len(t2img)
    with _bar(progress, n_txt) as bar:
        if dev.type != "cpu":
            return _mine_on_device(score_block, n_images, t2img, k, block, dev, bar)
        t2img_np = t2img.numpy()
        images = _Images(n_images, k, np.full(n_images, -np.inf))
        t2i = (np.empty((n_txt, k), np.int64), np.empty((n_txt, k), np.float32))
        for t0 in range(0, n_txt, block):
            t1 = min(t0 + block, n_txt)
            s = np.ascontiguousarray(_scored(score_block, t0, t1, n_images, dev).numpy())
            _block(s, np.arange(t0, t1), t2img_np, k, images, t2i, check_nan=False)
            bar.update(t1 - t0)
        ids, scores, _ = _merge_images(images, k, np.full(n_images, -np.inf))
    return _result(ids, scores, *t2i, t2img_np, k)


def _bar(progress: bool, total: int) -> Any:
    """A progress bar in captions (a context manager), drawn when ``progress`` and where
    :mod:`vlret._progress` draws bars."""
    return progress_bar(total=total, show=progress, desc="mining", unit="caption")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _finite_products(img: torch.Tensor, txt: torch.Tensor) -> bool:
    """Whether no float32 product of a row of ``txt`` and one of ``img`` can be NaN or
    infinite: finite entries, and ``D * max|img| * max|txt|`` far below float32's largest (no
    partial sum of a dot product exceeds it)."""
    if img.numel() == 0 or txt.numel() == 0:
        return True
    bound = float(img.shape[1])
    for x in (img, txt):
        lo, hi = torch.aminmax(x)
        bound *= max(abs(float(lo)), abs(float(hi)))
    return math.isfinite(bound) and bound < 1e37


def _mine_cpu(
    img: torch.Tensor, txt: torch.Tensor, t2img: np.ndarray, k: int, block: int, workers: int, bar
) -> OfflineNegatives:
    """Two-tower mining on the CPU: blocks of captions in a fixed random order, the first one
    giving each image a guess of its ``k``-th best (the ``r``-th best of the block, ``r`` for
    about ``_IMAGE_SLACK * k`` captions over the split); ``workers`` threads then score and
    select the other blocks, one BLAS thread each, into shared image lists. Images whose
    result falls below the guess are rescored whole (exact either way)."""
    n_txt, n_images = len(t2img), img.shape[0]
    order = torch.randperm(n_txt, generator=torch.Generator().manual_seed(0)).numpy()
    blocks = [np.sort(order[a : a + block]) for a in range(0, n_txt, block)]
    check_nan = not _finite_products(img, txt)
    t2i = (np.empty((n_txt, k), np.int64), np.empty((n_txt, k), np.float32))

    def scores(ids: np.ndarray) -> np.ndarray:
        return (txt.index_select(0, torch.from_numpy(ids)) @ img.t()).numpy()

    first = scores(blocks[0])
    c = len(blocks[0])
    r = max(8, math.ceil(_IMAGE_SLACK * k * c / n_txt))
    guess = np.full(n_images, -np.inf, dtype=np.float32)
    if r <= c // 4:
        first.reshape(-1)[np.arange(c) * n_images + t2img[blocks[0]]] = -np.inf
        guess = np.partition(np.ascontiguousarray(first.T), c - r, axis=1)[:, c - r]
    images = _Images(n_images, k, guess)
    _block(first, blocks[0], t2img, k, images, t2i, check_nan)
    lock, todo, stop = threading.Lock(), iter(blocks[1:]), threading.Event()
    bar.update(c)

    def work() -> None:
        while not stop.is_set():
            with lock:
                ids = next(todo, None)
            if ids is None:
                return
            try:
                _block(scores(ids), ids, t2img, k, images, t2i, check_nan)
            except BaseException:
                stop.set()
                raise
            with lock:
                bar.update(len(ids))

    workers = max(1, min(workers, len(blocks) - 1))
    if workers == 1:
        work()
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(workers) as pool:
                for done in [pool.submit(work) for _ in range(workers)]:
                    done.result()
        finally:
            torch.set_num_threads(threads)
    ids, best, failed = _merge_images(images, k, guess)
    rows = max(1, min(256, 1 << (31 - _bits(n_txt))))
    for a in range(0, len(failed), rows):  # rare: the guess was above the image's k-th best
        u = failed[a : a + rows]
        s = (img.index_select(0, torch.from_numpy(u)) @ txt.t()).numpy()
        ids[u], best[u] = _exact_rows(s, k, np.flatnonzero(t2img[None, :] == u[:, None]))
    return _result(ids, best, *t2i, t2img, k)


@torch.no_grad()
def mine_embeddings(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    txt_to_img: Any,
    *,
    k: int = DEFAULT_K,
    block_size: int = BLOCK,
    device: torch.device | str = "cpu",
    progress: bool = False,
    workers: int | None = None,
) -> OfflineNegatives:
    """:func:`mine_blocks` of two-tower embeddings: scores are ``txt_emb @ img_emb.T`` as given
    (normalise them first for cosine scores), one block of captions at a time on ``device``.
    On the CPU, blocks hold at most ``2**24`` scores, and ``workers`` threads (default
    ``torch.get_num_threads()``) score and select blocks side by side, one BLAS thread each
    (torch's thread count is 1 meanwhile); the result does not depend on blocks or threads."""
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
    if workers is not None:
        _positive("workers", workers)
    img = img_emb.to(device=device, dtype=torch.float32)
    if torch.device(device).type == "cpu":
        t2img = torch.as_tensor(txt_to_img, dtype=torch.long).cpu()
        check_k(k, img.shape[0], t2img)
        block = _checked_block_size(block_size, img.shape[0])
        block = min(block, max(1, _BLOCK_ENTRIES // img.shape[0]))
        txt = txt_emb.to(device="cpu", dtype=torch.float32)
        with _bar(progress, len(t2img)) as bar:
            return _mine_cpu(
                img, txt, t2img.numpy(), k, block, workers or torch.get_num_threads(), bar
            )

    def score(t0: int, t1: int) -> torch.Tensor:
        return txt_emb[t0:t1].to(device=device, dtype=torch.float32) @ img.t()

    return mine_blocks(
        score,
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


__all__ = [
    "BLOCK",
    "DEFAULT_K",
    "check_k",
    "mine_blocks",
    "mine_embeddings",
    "mine_pair_model",
    "top_k",
]
