"""Exhaustive relevance of the synthetic world and the clone forced choice.

A caption is relevant to an image when every fact it states is a fact of the image. That gives
the full ``(N_txt, N_img)`` relevance matrix, beside the one-ground-truth labels of the standard
protocol, for the relevance-aware metrics of :mod:`vlret.metrics.relevance` (R-Precision,
mAP@R, the ambiguity rate). The **clone forced choice** is the synthetic world's own: a caption
chooses between its image and a clone sibling that it does not describe (t2i), and an image
between its caption and the sibling's caption made from the same plan (i2t); a tie scores one
half, so chance is 50.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .language import N_FACTS


@dataclass(frozen=True)
class FactSets:
    """Sets of fact ids in CSR layout: set ``k`` is ``indices[indptr[k]:indptr[k + 1]]``."""

    indptr: np.ndarray
    indices: np.ndarray

    @classmethod
    def from_lists(cls, sets: Sequence[Sequence[int] | np.ndarray]) -> FactSets:
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
    img_sets: dict[int, set[int]] = {}
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


def _as_matrix(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    return t


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
    img, txt = _as_matrix(img_emb, "img_emb"), _as_matrix(txt_emb, "txt_emb")
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


def clone_group_images(groups) -> np.ndarray:
    """Boolean mask of the images that belong to a clone group of two or more."""
    grp = np.asarray(groups, dtype=np.int64)
    _, inverse, counts = np.unique(grp, return_inverse=True, return_counts=True)
    return counts[inverse] >= 2


__all__ = [
    "CloneChoice",
    "FactSets",
    "clone_forced_choice",
    "clone_group_images",
    "clone_trials",
    "fact_oracle_embeddings",
    "iter_relevance",
    "pairs_to_matrix",
    "relevance_matrix",
    "relevance_pairs",
]
