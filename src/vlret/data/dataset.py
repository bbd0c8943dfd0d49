"""The dataset contract shared by every on-disk format: one item per caption.

Every dataset in :mod:`vlret.data` is a :class:`RetrievalDataset`: one item per caption,
``(image features, caption ids, image index, caption index)``, plus ``txt_to_img`` (the image
index of each caption) for :func:`vlret.metrics.retrieval_metrics`. Its batches are
:class:`RetrievalBatch` (:func:`collate_retrieval`), and :meth:`RetrievalDataset.images` /
:meth:`RetrievalDataset.texts` serve each side alone for evaluation. :class:`LazyFeatures` is the
memory-mapped feature array the formats read their rows from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from .checks import SCAN_CHUNK_BYTES, check_in_dim, load_feature_array
from .expert_batch import ExpertBatch, ExpertSample
from .pixel_batch import PixelBatch, PixelSample


class CaptionEncoder(Protocol):
    """Turns a caption into token ids; ``pad_id`` fills padded batches.

    Implemented by :class:`vlret.data.vocab.Vocabulary` and
    :class:`vlret.data.vocab.HFTokenizer`.
    """

    pad_id: int

    def encode(self, text: str) -> list[int]: ...


class RetrievalItem(NamedTuple):
    """One caption with its image.

    Attributes:
        features: The image's features (a tensor, or what a Karpathy dataset's image
            transform returns).
        caption: The caption's token ids, or its text without an encoder.
        img_index: The image's index in the dataset.
        cap_index: The caption's index in the dataset.
    """

    features: Any
    caption: torch.Tensor | str
    img_index: int
    cap_index: int


@dataclass
class RetrievalBatch:
    """A collated batch; ``captions`` is ``(B, L)`` padded ids with ``lengths`` ``(B,)``.

    Without an encoder, ``captions`` is the list of texts and ``lengths`` is ``None``.
    ``img_index`` gives the in-batch positives (two captions of one image share it), unless
    ``identity`` is set: person-search data sets give each item its person's training identity
    (``0..N-1``), and every pair of the same person is then a positive.
    ``offline`` (AOQ's training set, :class:`vlret.data.offline_negatives.OfflineNegativesDataset`)
    is the batch of each item's offline negatives, ``2B`` items interleaved: row ``2i`` pairs
    item ``i``'s offline negative image ``I'_i`` with its offline negative caption ``T'_i``, row
    ``2i + 1`` the quintuplet pair ``(I''_i, T''_i)``; ``None`` elsewhere.
    """

    features: torch.Tensor | ExpertBatch | PixelBatch | list[Any]
    captions: torch.Tensor | list[str]
    lengths: torch.Tensor | None
    img_index: torch.Tensor
    cap_index: torch.Tensor
    identity: torch.Tensor | None = None
    offline: RetrievalBatch | None = None

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> RetrievalBatch:
        """A copy with every tensor moved to ``device`` (lists stay as they are); uint8
        images (a :class:`~vlret.data.pixel_batch.PixelBatch`) arrive normalised to float32."""

        def move(t):
            if isinstance(t, RetrievalBatch):  # AOQ's offline negatives
                return t.to(device, non_blocking=non_blocking)
            if isinstance(t, PixelBatch):
                return t.to(device, non_blocking=non_blocking).normalised()
            if isinstance(t, torch.Tensor | ExpertBatch):
                return t.to(device, non_blocking=non_blocking)
            return t

        return RetrievalBatch(*(move(getattr(self, f)) for f in self.__dataclass_fields__))

    def chunks(self, size: int) -> list[RetrievalBatch]:
        """Consecutive sub-batches of at most ``size`` items (gradient caching encodes them one
        at a time). Captions keep the batch's padded width, so a chunk encodes each item exactly
        as the whole batch does; an ``offline`` batch is cut with its items (two rows each)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")

        def part(value, start, stop):
            if isinstance(value, RetrievalBatch):  # AOQ's offline negatives: two rows per item
                rows = [getattr(value, f) for f in value.__dataclass_fields__]
                return RetrievalBatch(*(part(v, 2 * start, 2 * stop) for v in rows))
            return None if value is None else value[start:stop]

        fields = [getattr(self, f) for f in self.__dataclass_fields__]
        return [
            RetrievalBatch(*(part(v, i, i + size) for v in fields))
            for i in range(0, len(self.img_index), size)
        ]


def pad_captions(
    captions: Sequence[torch.Tensor], *, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D id tensors into one batch.

    Args:
        captions: 1-D id tensors.
        pad_id: The id written into padding.

    Returns:
        ``(ids, lengths)``: ``(B, max_len)`` long ids and ``(B,)`` lengths.
    """
    lengths = torch.tensor([len(c) for c in captions], dtype=torch.long)
    width = int(lengths.max()) if len(captions) else 0
    out = torch.full((len(captions), width), pad_id, dtype=torch.long)
    for row, cap in enumerate(captions):
        out[row, : len(cap)] = cap
    return out, lengths


def stack_features(feats: Sequence[Any]) -> torch.Tensor | ExpertBatch | PixelBatch | list[Any]:
    """Stack tensors, collate videos' experts into an :class:`ExpertBatch` and uint8 images into
    a :class:`PixelBatch`; anything else (image paths, PIL images) stays a list."""
    if isinstance(feats[0], ExpertSample):
        return ExpertBatch.collate(feats)
    if isinstance(feats[0], PixelSample):
        return PixelBatch.collate(feats)
    return torch.stack(list(feats)) if isinstance(feats[0], torch.Tensor) else list(feats)


def collate_retrieval(items: Sequence[RetrievalItem], *, pad_id: int = 0) -> RetrievalBatch:
    """Collate retrieval items into a batch, in the items' order.

    Args:
        items: The items.
        pad_id: The id written into caption padding.

    Returns:
        The batch: stacked features (a list for image paths or PIL images), padded captions
        (the texts without an encoder) and both indices.

    Raises:
        ValueError: ``items`` is empty.
    """
    if not items:
        raise ValueError("collate_retrieval needs at least one item")
    feats = stack_features([it[0] for it in items])
    caps = [it[1] for it in items]
    captions: torch.Tensor | list[str]
    if isinstance(caps[0], str):  # every caption a text (one dataset)
        captions, lengths = cast("list[str]", list(caps)), None
    else:
        captions, lengths = pad_captions(cast("list[torch.Tensor]", caps), pad_id=pad_id)
    img_index = torch.tensor([it[2] for it in items], dtype=torch.long)
    cap_index = torch.tensor([it[3] for it in items], dtype=torch.long)
    return RetrievalBatch(feats, captions, lengths, img_index, cap_index)


class RetrievalDataset(Dataset):
    """One item per caption: ``RetrievalItem(features, caption, img_index, cap_index)``.

    Subclasses set ``captions`` (texts in caption order), ``txt_to_img`` (long tensor, image
    index of each caption), ``image_ids`` (external id of each image) and implement
    :meth:`image`. ``encoder`` (a :class:`CaptionEncoder`) turns texts into ids; without one the
    items carry the raw text. Person-search data sets also set ``image_identity``: the person
    id of each image as the annotation file writes it (a caption's person is its image's).
    """

    captions: list[str]
    txt_to_img: torch.Tensor
    image_ids: list[Any]
    encoder: CaptionEncoder | None
    #: Person-search data: the raw person id of each image, ``(n_images,)`` long; None elsewhere
    #: (relevance is then the image of the caption).
    image_identity: torch.Tensor | None = None
    #: Training augmentation (:class:`vlret.data.transforms.RandomResizedCrop`) that items
    #: read through instead of :meth:`image` (:meth:`set_augment`); evaluation views
    #: (:meth:`images`) always use :meth:`image`.
    augment: Any = None
    #: The run seed and the epoch of the augmentation's per-sample key
    #: ``(augment_seed, epoch, caption index)``.
    augment_seed: int = 0
    epoch: int = 0
    #: Training augmentation of the captions (``data.text_augment``,
    #: :mod:`vlret.data.caption_augment`): items read their caption through
    #: ``text_augment(text, key=(augment_seed, epoch, index))`` (:meth:`set_text_augment`);
    #: :meth:`caption` and the evaluation views never do.
    text_augment: Any = None

    def set_augment(self, augment: Any, *, seed: int) -> None:
        """Serve items through ``augment(image_source(img), key=(seed, epoch, index))``
        (None: back to :meth:`image`)."""
        self.augment, self.augment_seed = augment, int(seed)

    def set_text_augment(self, augment: Any, *, seed: int) -> None:
        """Serve items' captions through ``augment(text, key=(seed, epoch, index))`` (None:
        back to :meth:`caption`)."""
        self.text_augment, self.augment_seed = augment, int(seed)

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the augmentation's key (set before each epoch's DataLoader is made,
        so its workers copy it)."""
        self.epoch = int(epoch)

    def image_source(self, index: int) -> Any:
        """What the augmentation reads for image ``index`` (a file or PIL image)."""
        raise NotImplementedError(f"{type(self).__name__} serves no image files to augment")

    @property
    def num_images(self) -> int:
        """Number of images."""
        return len(self.image_ids)

    @property
    def num_captions(self) -> int:
        """Number of captions (= items)."""
        return len(self.captions)

    def image(self, index: int) -> Any:
        """The input of image ``index`` to the image encoder."""
        raise NotImplementedError

    def caption(self, index: int) -> torch.Tensor | str:
        """Caption ``index`` as token ids, or its text without an encoder."""
        text = self.captions[index]
        if self.encoder is None:
            return text
        return torch.tensor(self.encoder.encode(text), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, index: int) -> RetrievalItem:
        if not -len(self) <= index < len(self):
            raise IndexError(f"caption index {index} out of range for {len(self)} captions")
        index %= len(self)
        img = int(self.txt_to_img[index])
        if self.augment is not None:
            key = (self.augment_seed, self.epoch, index)
            features = self.augment(self.image_source(img), key=key)
        else:
            features = self.image(img)
        if self.text_augment is not None:
            key = (self.augment_seed, self.epoch, index)
            return RetrievalItem(
                features, self.text_augment(self.captions[index], key=key), img, index
            )
        return RetrievalItem(features, self.caption(index), img, index)

    @property
    def pad_id(self) -> int:
        """The encoder's padding id (0 without an encoder)."""
        return 0 if self.encoder is None else int(self.encoder.pad_id)

    def collate(self, items: Sequence[RetrievalItem]) -> RetrievalBatch:
        """``collate_fn`` for a ``DataLoader`` over this dataset (pads with the encoder's id)."""
        return collate_retrieval(items, pad_id=self.pad_id)

    def images(self) -> ImageView:
        """A dataset over the images only (each encoded once at evaluation)."""
        return ImageView(self)

    def texts(self) -> CaptionView:
        """A dataset over the captions only (no image features are read)."""
        return CaptionView(self)

    def check_features(
        self, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> None:
        """Check the features this dataset serves (nothing to check in this base class).

        Args:
            in_dim: The model's ``model.image.in_dim``; None skips the size check.
            chunk_bytes: Bytes of features scanned at a time.

        Raises:
            ValueError: ``in_dim`` is neither None nor a positive int.
            DataFormatError: The features hold NaN or inf, or have another last dimension.
        """
        check_in_dim(in_dim)


def check_features(
    dataset: RetrievalDataset, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
) -> None:
    """Check a dataset's features before training (:meth:`RetrievalDataset.check_features`).

    The error names the file, the first bad row (image or video, region or frame, dimension)
    and the value found, or the shape and ``model.image.in_dim``.

    Args:
        dataset: The dataset.
        in_dim: The model's ``model.image.in_dim``; None skips the size check.
        chunk_bytes: Bytes of features scanned at a time.

    Raises:
        ValueError: ``in_dim`` is neither None nor a positive int.
        DataFormatError: The features hold NaN or inf, or have another last dimension.
    """
    dataset.check_features(in_dim=in_dim, chunk_bytes=chunk_bytes)


class ImageView(Dataset):
    """Items ``(features, img_index)``; collate with :meth:`collate`."""

    def __init__(self, base: RetrievalDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return self.base.num_images

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.base.image(index), index

    @staticmethod
    def collate(
        items: Sequence[tuple[Any, int]],
    ) -> tuple[torch.Tensor | ExpertBatch | PixelBatch | list[Any], torch.Tensor]:
        """``(features, img_index)`` of a batch of images."""
        feats = stack_features([it[0] for it in items])
        return feats, torch.tensor([it[1] for it in items], dtype=torch.long)


class CaptionView(Dataset):
    """Items ``(caption, cap_index)``; :meth:`collate` returns ``(ids, lengths, cap_index)``."""

    def __init__(self, base: RetrievalDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return self.base.num_captions

    def __getitem__(self, index: int) -> tuple[torch.Tensor | str, int]:
        return self.base.caption(index), index

    def collate(self, items: Sequence[tuple[torch.Tensor | str, int]]):
        """``(ids, lengths, cap_index)`` of a batch of captions (texts and None without ids)."""
        index = torch.tensor([it[1] for it in items], dtype=torch.long)
        caps = [it[0] for it in items]
        if caps and isinstance(caps[0], str):
            return caps, None, index
        ids, lengths = pad_captions(cast("list[torch.Tensor]", caps), pad_id=self.base.pad_id)
        return ids, lengths, index


class LazyFeatures:
    """A memory-mapped feature array opened on first use in each process.

    Pickling (DataLoader workers under ``spawn``) sends the path, not the array: pickling an
    ``np.memmap`` would copy the whole file into every worker.
    """

    def __init__(self, path: Path, *, mmap: bool = True, array: np.ndarray | None = None) -> None:
        self.path = Path(path)
        self.mmap = mmap
        self._array = array

    @property
    def array(self) -> np.ndarray:
        """The array, opened on first use."""
        if self._array is None:
            self._array = load_feature_array(self.path, mmap=self.mmap)
        return self._array

    def row(self, index: int) -> torch.Tensor:
        """Row ``index`` as a float32 tensor."""
        return torch.from_numpy(np.array(self.array[index], dtype=np.float32))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.mmap:
            state["_array"] = None
        return state


def first_images(dataset: RetrievalDataset, max_images: int | None) -> RetrievalDataset:
    """Keep the first ``max_images`` images of ``dataset`` and their captions, in place (a dev
    set read on its first images); ``None`` or a larger number keeps them all."""
    if max_images is None or max_images >= dataset.num_images:
        return dataset
    keep = dataset.txt_to_img < max_images
    dataset.captions = [c for c, k in zip(dataset.captions, keep.tolist(), strict=True) if k]
    dataset.txt_to_img = dataset.txt_to_img[keep]
    dataset.image_ids = dataset.image_ids[:max_images]
    return dataset


__all__ = [
    "CaptionEncoder",
    "CaptionView",
    "ImageView",
    "LazyFeatures",
    "RetrievalBatch",
    "RetrievalDataset",
    "RetrievalItem",
    "check_features",
    "collate_retrieval",
    "first_images",
    "pad_captions",
    "stack_features",
]
