"""Encoding a split once for evaluation: two-tower embeddings (:func:`encode_dataset`) and a
pair-scoring model's region and word features (:func:`encode_tokens`, words packed in
:class:`TextTokens`: the real tokens of all captions one after the other, no padding, so COCO
5K's 25,000 captions take their ~290,000 tokens' worth of memory, not 25,000 x the longest
caption's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .._modules import unwrap_model
from .._progress import progress_bar
from ..data import RetrievalDataset
from ..models import PairScorer


def check_device(device: torch.device | str) -> torch.device:
    """``device`` as a ``torch.device``; a bad name raises ``ValueError`` naming ``device``."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: {err}") from None


@torch.no_grad()
def encode_dataset(
    model: nn.Module,
    dataset: RetrievalDataset,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    normalize: bool = True,
    num_workers: int = 0,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(img_emb (N_img, E), txt_emb (N_txt, E))`` in float32 on the CPU, each image encoded
    once. The model is put in eval mode and restored afterwards. ``progress``: a bar per
    side, in batches (drawn on a terminal, :mod:`vlret._progress`)."""
    model = unwrap_model(model)
    was_training = model.training
    # Loaders with their own generator leave the global torch RNG untouched (exact resume).
    gen = torch.Generator().manual_seed(0)
    model.eval()
    try:
        img_parts = encoded_images(
            model, dataset, batch_size, device, num_workers, gen, progress=progress
        )
        texts = dataset.texts()
        txt_parts = []
        loader = DataLoader(
            texts,
            batch_size=batch_size,
            collate_fn=texts.collate,
            num_workers=num_workers,
            generator=gen,
        )
        for caps, lengths, _ in _bar(loader, "encoding captions", progress):
            if isinstance(caps, torch.Tensor):
                caps = caps.to(device)
            encoded = cast(Any, model).encode_texts(caps, lengths)  # a vlret model's method
            txt_parts.append(encoded.float().cpu())
    finally:
        model.train(was_training)
    img, txt = torch.cat(img_parts), torch.cat(txt_parts)
    if normalize:
        img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    return img, txt


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
    progress: bool = False,
) -> tuple[torch.Tensor, TextTokens]:
    """``(regions (N_img, R, D), words)``: every image's region features and every caption's
    word features from ``model.encode_images`` / ``model.encode_texts``, each image and
    caption encoded once, in float32 on the CPU (words packed, :class:`TextTokens`).

    The model is put in eval mode and its training mode restored afterwards. ``progress``: a
    bar per side, in batches (drawn on a terminal, :mod:`vlret._progress`)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    device = check_device(device)
    model = unwrap_model(model)
    was_training = model.training
    gen = torch.Generator().manual_seed(0)  # loaders leave the global RNG untouched
    model.eval()
    try:
        regions = encoded_images(
            model, dataset, batch_size, device, num_workers, gen, progress=progress
        )
        texts = dataset.texts()
        packed, lengths = [], []
        loader = DataLoader(
            texts,
            batch_size=batch_size,
            collate_fn=texts.collate,
            num_workers=num_workers,
            generator=gen,
        )
        for caps, lens, _ in _bar(loader, "encoding captions", progress):
            if lens is None:
                raise ValueError(
                    "encode_tokens needs token ids (a dataset with a caption encoder), got raw text"
                )
            words = cast(Any, model).encode_texts(caps.to(device), lens.to(device))
            # a multi-expert model's "words" are its E per-expert vectors, not the tokens
            if isinstance(model, PairScorer):
                lens = model.token_lengths(lens)
            packed.append(pack_words(words.float(), lens).cpu())
            lengths.append(lens.cpu())
    finally:
        model.train(was_training)
    dim = regions[0].shape[-1] if regions else 0
    words = torch.cat(packed) if packed else torch.zeros(0, dim)
    lens = torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.long)
    return torch.cat(regions), TextTokens(words, lens)


def encoded_images(
    model, dataset, batch_size, device, num_workers, generator, *, progress: bool = False
) -> list:
    """``model.encode_images`` of each image once, per batch, float32 on the CPU (the caller
    sets eval mode; the loader draws from ``generator``, never from the global RNG), behind a
    bar when ``progress``."""
    images = dataset.images()
    out = []
    loader = DataLoader(
        images,
        batch_size=batch_size,
        collate_fn=images.collate,
        num_workers=num_workers,
        generator=generator,
    )
    for feats, _ in _bar(loader, "encoding images", progress):
        if hasattr(feats, "to"):  # a tensor or an ExpertBatch (image paths stay a list)
            feats = feats.to(device)
        out.append(model.encode_images(feats).float().cpu())
    return out


def _bar(loader: DataLoader, desc: str, show: bool) -> Any:
    """``loader`` behind a bar in batches, gone once done (the results table follows)."""
    return progress_bar(loader, show=show, desc=desc, unit="batch", leave=False)


__all__ = [
    "TextTokens",
    "check_device",
    "encode_dataset",
    "encode_tokens",
    "encoded_images",
    "pack_words",
]
