"""AdaCL's momentum memory bank for models that score pairs themselves (SCAN, BFAN, SGRAF): the
bank of past items' encodings and their scores against a batch.

A two-tower model's queue holds one embedding per past image and caption
(:class:`~vlret.memory.MemoryQueue`). A pair scorer has none: it scores an image's regions
against a caption's words together. Its bank (:class:`PairMemoryBank`) therefore holds each
past item's *encodings*, the model's per-item output before cross-attention: the ``(R, D)``
region features of an image and the ``(W, D)`` word features of a caption with their length,
plus the image id of each entry. :func:`bank_scores` scores a batch's encodings against the
filled entries with the model's own ``score``, block by block under activation checkpointing,
and :func:`bank_loss` hands these scores to the loss as extra negatives. The training
procedure that fills the bank and trains with it is :mod:`vlret.train.procedures.pair_bank`.

**Memory.** The bank holds ``size x (R x D + W x D)`` numbers in its dtype (float32 by default:
4 bytes each), ``W`` the longest caption of the training split in the model's rows
(:attr:`PairMemoryBank.feature_bytes`; ids, lengths and flags add ``17 x size`` bytes). Scoring
it costs ``2 x B x K`` pair scores a step against ``B x B`` without it; the queued pairs are
scored ``block_pairs`` pairs at a time, each block under activation checkpointing, so the step
keeps one block's intermediates (recomputed in backward) instead of all of them.

**Pair scores of queued items.** Every pair score of SCAN and BFAN depends only on its own
regions and words, so the scores equal those of the queued items concatenated to the batch.
SGRAF in evaluation mode too; in training mode its BatchNorms normalise over the images of a
call and dropout draws per call: the current images' blocks are normalised over the current
batch (as the in-batch scores), each block of queued images over that block, and the bank's
calls leave the running statistics untouched (restored after each call), so they follow the
batch as without a bank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.utils.checkpoint as activation_checkpoint
from torch import nn

from ..._modules import unwrap_model
from ...memory import NO_ID, as_id_tensor
from ...models.pair_scorer import PairScoringModel
from ...similarity import positive_mask

#: Queued pairs scored per call (per block) by default: ``B x entries`` or ``entries x B``.
DEFAULT_BLOCK_PAIRS = 8192


def positive_int(value: Any, name: str) -> int:
    """``value`` when it is a positive integer (not a bool); else a ``ValueError`` naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class PairMemoryBank(nn.Module):
    """First-in first-out bank of encoded images and captions of past batches.

    Buffers (all in ``state_dict``): ``regions`` ``(size, R, D)``, ``words`` ``(size, W, D)``
    (zero past each caption's length), ``lengths`` ``(size,)`` (the rows of each caption, the
    model's ``token_lengths``), ``ids`` ``(size,)`` (the image id of each entry, ``-1`` where
    unknown), ``valid`` ``(size,)`` and ``ptr`` (the next slot). Slots are written in order and
    wrap around, so the filled slots are always ``0 .. len(bank) - 1`` (:meth:`entries` gives
    views of them, no copy); a batch longer than the bank keeps its last ``size`` rows.

    Args:
        size: Number of entries (AdaCL's ``M``: ``loss.queue_size``).
        regions: Rows per image ``R`` (regions, or experts).
        dim: Feature size ``D`` of a region.
        words_max: Rows per caption ``W`` the bank can hold (the longest caption).
        word_dim: Feature size of a word (default ``dim``).
        dtype: Floating-point dtype of the stored features.

    Raises:
        ValueError: A size is not a positive integer or ``dtype`` is not floating point.
    """

    regions: torch.Tensor
    words: torch.Tensor
    lengths: torch.Tensor
    ids: torch.Tensor
    valid: torch.Tensor
    ptr: torch.Tensor

    def __init__(
        self,
        size: int,
        regions: int,
        dim: int,
        words_max: int,
        *,
        word_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.size = positive_int(size, "size")
        self.num_regions = positive_int(regions, "regions")
        self.dim = positive_int(dim, "dim")
        self.words_max = positive_int(words_max, "words_max")
        self.word_dim = positive_int(dim if word_dim is None else word_dim, "word_dim")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.register_buffer("regions", torch.zeros(size, regions, dim, dtype=dtype))
        self.register_buffer("words", torch.zeros(size, words_max, self.word_dim, dtype=dtype))
        self.register_buffer("lengths", torch.zeros(size, dtype=torch.long))
        self.register_buffer("ids", torch.full((size,), NO_ID, dtype=torch.long))
        self.register_buffer("valid", torch.zeros(size, dtype=torch.bool))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    @staticmethod
    def bytes_for(
        size: int, regions: int, dim: int, words_max: int, word_dim: int, dtype: torch.dtype
    ) -> int:
        """``size x (regions x dim + words_max x word_dim) x bytes per number``: the features'
        bytes of a bank of these sizes."""
        per_number = torch.empty((), dtype=dtype).element_size()
        return size * (regions * dim + words_max * word_dim) * per_number

    @property
    def feature_bytes(self) -> int:
        """Bytes of the stored features (``regions`` and ``words``), as :meth:`bytes_for`."""
        return self.bytes_for(
            self.size, self.num_regions, self.dim, self.words_max, self.word_dim, self.words.dtype
        )

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer: the features plus ids, lengths, flags and the pointer."""
        return sum(b.nbytes for b in self.buffers())

    def describe(self) -> str:
        """One line: entries, their shapes and the bank's bytes."""
        per = self.words.element_size()
        return (
            f"memory bank: {self.size} entries x ({self.num_regions} regions x {self.dim} + "
            f"{self.words_max} words x {self.word_dim}) x {per} bytes = "
            f"{self.feature_bytes / 2**20:.1f} MiB ({self.feature_bytes} bytes)"
        )

    def __len__(self) -> int:
        """Number of filled entries."""
        return int(self.valid.sum())

    @torch.no_grad()
    def enqueue(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        lengths: torch.Tensor,
        ids: torch.Tensor | Sequence[int] | None = None,
    ) -> None:
        """Write a batch's encodings (detached) at the pointer, wrapping around.

        Args:
            regions: ``(n, R, D)`` encoded images.
            words: ``(n, L, D)`` encoded captions, ``L <= words_max`` rows (zero-padded here).
            lengths: ``(n,)`` rows of each caption, in ``1..words_max``.
            ids: The image id of each entry (``>= 0``); None stores ``-1`` (no query's).

        Raises:
            ValueError: A shape, length or id that does not fit the bank, or NaN / inf.
        """
        n = regions.shape[0] if isinstance(regions, torch.Tensor) else -1
        want = (n, self.num_regions, self.dim)
        if not isinstance(regions, torch.Tensor) or regions.dim() != 3 or regions.shape != want:
            got = tuple(regions.shape) if isinstance(regions, torch.Tensor) else type(regions)
            want_s = f"(n, {self.num_regions}, {self.dim})"
            raise ValueError(f"regions must have shape {want_s}, got {got}")
        if not isinstance(words, torch.Tensor) or words.dim() != 3 or words.shape[0] != n:
            got = tuple(words.shape) if isinstance(words, torch.Tensor) else type(words)
            raise ValueError(f"words must have shape ({n}, L, {self.word_dim}), got {got}")
        if words.shape[2] != self.word_dim:
            raise ValueError(f"words must have {self.word_dim} features, got {words.shape[2]}")
        lengths = torch.as_tensor(lengths)
        if lengths.shape != (n,) or lengths.dtype.is_floating_point:
            raise ValueError(f"lengths must be ({n},) integers, got {tuple(lengths.shape)}")
        if n and (int(lengths.min()) < 1 or int(lengths.max()) > self.words_max):
            raise ValueError(
                f"lengths must lie in 1..words_max={self.words_max}, got "
                f"{int(lengths.min())}..{int(lengths.max())} (a caption longer than the "
                "longest of the training split)"
            )
        for name, t in (("regions", regions), ("words", words)):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} holds NaN or inf")
        id_t = (
            torch.full((n,), NO_ID, dtype=torch.long)
            if ids is None
            else as_id_tensor(ids, "ids", n)
        )
        if n == 0:
            return
        device, dtype = self.regions.device, self.regions.dtype
        width = min(words.shape[1], self.words_max)
        padded = torch.zeros(n, self.words_max, self.word_dim, dtype=dtype, device=device)
        padded[:, :width] = words[:, :width].to(device, dtype)
        rows = torch.arange(self.words_max, device=device)[None, :] < lengths.to(device)[:, None]
        padded.masked_fill_(~rows[..., None], 0.0)  # nothing past a caption's length
        regions = regions.detach().to(device, dtype)
        lengths, id_t = lengths.to(device, torch.long), id_t.to(device)
        if n > self.size:  # only the newest `size` rows survive, where the overflow ends
            start = int(self.ptr) + n - self.size
            regions, padded, lengths, id_t = (
                t[-self.size :] for t in (regions, padded, lengths, id_t)
            )
        else:
            start = int(self.ptr)
        slots = (start + torch.arange(regions.shape[0], device=device)) % self.size
        self.regions.index_copy_(0, slots, regions)
        self.words.index_copy_(0, slots, padded)
        self.lengths.index_copy_(0, slots, lengths)
        self.ids.index_copy_(0, slots, id_t)
        self.valid[slots] = True
        self.ptr.fill_((int(self.ptr) + n) % self.size)

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the filled entries in slot order: ``(regions, words, lengths, ids)``."""
        n = len(self)
        return self.regions[:n], self.words[:n], self.lengths[:n], self.ids[:n]

    def negative_mask(self, query_ids: torch.Tensor) -> torch.Tensor:
        """``(n_query, len(bank))`` bool: the filled entries of another image than the query's
        (an entry is never a negative of its own image's queries)."""
        ids = self.entries()[3]
        q = as_id_tensor(query_ids, "query_ids", query_ids.shape[0]).to(ids.device)
        return ids[None, :] != q[:, None]

    @torch.no_grad()
    def reset(self) -> None:
        """Empty the bank."""
        for t in (self.regions, self.words, self.lengths, self.valid, self.ptr):
            t.zero_()
        self.ids.fill_(NO_ID)

    def extra_repr(self) -> str:
        return (
            f"size={self.size}, regions={self.num_regions}, dim={self.dim}, "
            f"words_max={self.words_max}, word_dim={self.word_dim}"
        )


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Restore every buffer of ``model`` (BatchNorm running statistics) on exit.

    Only a buffer the call changed is written back: an in-place write bumps a tensor's version,
    and a buffer the forward read as an index (a BERT's ``position_ids``) is saved for the
    backward, which then refuses to run."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, copy in saved:
                if not torch.equal(b, copy):
                    b.copy_(copy)


def _blocks(total: int, per_block: int) -> list[tuple[int, int]]:
    """``total`` entries in near-equal blocks of at least ``min(per_block, total)`` each (so a
    training-mode BatchNorm never sees a block of one image when ``per_block >= 2``)."""
    if total == 0:
        return []
    count = max(1, total // per_block)
    bounds = [round(i * total / count) for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def bank_scores(
    model: nn.Module,
    regions: torch.Tensor,
    words: torch.Tensor,
    rows: torch.Tensor,
    bank: PairMemoryBank,
    *,
    block_pairs: int = DEFAULT_BLOCK_PAIRS,
    checkpoint: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The current batch scored against the bank by the model's own ``score``.

    Args:
        model: A :class:`~vlret.models.PairScorer`.
        regions: ``(B, R, D)`` the batch's encoded images (with gradient).
        words: ``(B, L, D)`` the batch's encoded captions.
        rows: ``(B,)`` rows of each caption (``token_lengths``).
        bank: The bank; its filled entries are scored.
        block_pairs: Queued pairs per ``score`` call: ``max(2, block_pairs // B)`` entries a
            block (in near-equal blocks).
        checkpoint: Recompute each block in backward instead of keeping its intermediates
            (when gradient is on).

    Returns:
        ``(to_txt, to_img)``: the ``(B, K)`` scores of the current images with the queued
        captions and the ``(K, B)`` scores of the queued images with the current captions,
        ``K = len(bank)``. The model's buffers are as before the call.
    """
    q_regions, q_words, q_rows, _ = bank.entries()
    k, b = q_regions.shape[0], regions.shape[0]
    dtype = torch.promote_types(regions.dtype, torch.float32)
    if k == 0:
        empty = regions.new_zeros((b, 0), dtype=dtype)
        return empty, empty.t()
    per_block = max(2, positive_int(block_pairs, "block_pairs") // max(b, 1))
    scorer = cast(PairScoringModel, unwrap_model(model))

    def score(r: torch.Tensor, w: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        with buffers_kept(scorer):  # running statistics: the batch's call only
            return scorer.score(r, w, n)

    def call(*args: torch.Tensor) -> torch.Tensor:
        if checkpoint and torch.is_grad_enabled():
            out = activation_checkpoint.checkpoint(score, *args, use_reentrant=False)
            assert isinstance(out, torch.Tensor)  # score returns one tensor
            return out
        return score(*args)

    q_regions, q_words = q_regions.to(regions.dtype), q_words.to(words.dtype)
    to_txt, to_img = [], []
    for k0, k1 in _blocks(k, per_block):
        top = int(q_rows[k0:k1].max())  # each block trimmed to its longest caption
        to_txt.append(call(regions, q_words[k0:k1, :top], q_rows[k0:k1]))
        to_img.append(call(q_regions[k0:k1], words, rows))
    return torch.cat(to_txt, dim=1), torch.cat(to_img, dim=0)


def bank_loss(
    loss_fn: Any,
    sim: torch.Tensor,
    ids: torch.Tensor,
    to_txt: torch.Tensor,
    to_img: torch.Tensor,
    bank: PairMemoryBank,
) -> torch.Tensor:
    """The loss of the in-batch scores ``sim`` ``(B, B)`` with the bank's as extra negatives:
    ``loss_fn.from_similarity(sim, pos_mask, extra_neg_txt=to_txt, extra_neg_img=to_img,
    ...)`` with the masks of the entries of another image than each row's (column's)."""
    pos_mask = positive_mask(ids, ids).to(sim.device)
    negatives = bank.negative_mask(ids).to(sim.device)  # (B, K)
    wide = sim.dtype
    return loss_fn.from_similarity(
        sim,
        pos_mask,
        extra_neg_txt=to_txt.to(wide),
        extra_neg_txt_mask=negatives,
        extra_neg_img=to_img.to(wide),
        extra_neg_img_mask=negatives.t(),
    )


__all__ = [
    "DEFAULT_BLOCK_PAIRS",
    "PairMemoryBank",
    "bank_loss",
    "bank_scores",
    "buffers_kept",
    "positive_int",
]
