"""SCAN / VSE-infinity precomputed features, and the dataset contract shared by every format.

A precomputed data folder holds, per split (``train``, ``dev``, ``test``, ``testall``):

* ``{split}_ims.npy``: float32 ``(N_img, R, D)`` region features (bottom-up attention:
  ``R=36, D=2048``) or ``(N_img, D)`` plain vectors for frozen-backbone setups. It is opened with
  ``np.load(mmap_mode="r")``: COCO train is about 33 GB and is never read whole.
* ``{split}_caps.txt``: one caption per line, ``captions_per_image`` (5) consecutive lines per
  image, in image order.
* ``{split}_ids.txt`` (optional): the image ids (Karpathy ``imgid`` for Flickr30K, ``cocoid`` for
  COCO), in one of two layouts: one line per caption (COCO ``testall``, F30K ``test``/``dev``)
  or one line per image (the train splits). The ids are per caption only when their count
  equals the caption count; otherwise there must be one per image.

Every dataset in :mod:`vlret.data` is a :class:`RetrievalDataset`: one item per caption,
``(image features, caption ids, image index, caption index)``, plus ``txt_to_img`` (the image
index of each caption) for :func:`vlret.metrics.retrieval_metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from .checks import (
    SCAN_CHUNK_BYTES,
    DataFormatError,
    NonFinite,
    check_feature_size,
    check_in_dim,
    find_non_finite,
    load_feature_array,
    read_lines,
)

# Shared with the other formats; DataFormatError, NonFinite and find_non_finite stay importable
# from here.
from .expert_batch import ExpertBatch, ExpertSample

SPLITS = ("train", "dev", "test", "testall")
#: Splits whose captions may build a vocabulary (never a test split).
VOCAB_SPLITS = ("train", "dev")


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
    ``img_index`` gives the in-batch positives (two captions of one image share it).
    """

    features: torch.Tensor | ExpertBatch | list[Any]
    captions: torch.Tensor | list[str]
    lengths: torch.Tensor | None
    img_index: torch.Tensor
    cap_index: torch.Tensor

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> RetrievalBatch:
        """A copy with every tensor moved to ``device`` (lists stay as they are)."""

        def move(t):
            if isinstance(t, torch.Tensor | ExpertBatch):
                return t.to(device, non_blocking=non_blocking)
            return t

        return RetrievalBatch(*(move(getattr(self, f)) for f in self.__dataclass_fields__))

    def chunks(self, size: int) -> list[RetrievalBatch]:
        """Consecutive sub-batches of at most ``size`` items (gradient caching encodes them one
        at a time). Captions keep the batch's padded width, so a chunk encodes each item exactly
        as the whole batch does."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")

        def part(value, i):
            return None if value is None else value[i : i + size]

        fields = [getattr(self, f) for f in self.__dataclass_fields__]
        return [
            RetrievalBatch(*(part(v, i) for v in fields))
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


def stack_features(feats: Sequence[Any]) -> torch.Tensor | ExpertBatch | list[Any]:
    """Stack tensors, collate videos' experts into an :class:`ExpertBatch`; anything else
    (image paths, PIL images) stays a list."""
    if isinstance(feats[0], ExpertSample):
        return ExpertBatch.collate(feats)
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
    items carry the raw text.
    """

    captions: list[str]
    txt_to_img: torch.Tensor
    image_ids: list[Any]
    encoder: CaptionEncoder | None

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
        return RetrievalItem(self.image(img), self.caption(index), img, index)

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
    ) -> tuple[torch.Tensor | ExpertBatch | list[Any], torch.Tensor]:
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


def parse_precomp_ids(
    path: Path, *, n_captions: int, n_images: int, captions_per_image: int
) -> list[int]:
    """One id per image from ``{split}_ids.txt`` in either layout.

    Per-caption when the id count equals the caption count (the ``captions_per_image`` ids of
    an image must then agree), per-image when it equals the image count.

    Args:
        path: The ids file.
        n_captions: Captions of the split.
        n_images: Images of the split.
        captions_per_image: Consecutive captions per image.

    Returns:
        The id of each image.

    Raises:
        DataFormatError: A line is not an integer, the captions of an image disagree, or the
            id count matches neither layout.
    """
    lines = read_lines(path, "one integer image id per line")
    ids = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            raise DataFormatError(path, "empty line; expected an integer image id", line=number)
        try:
            ids.append(int(text.strip()))
        except ValueError:
            raise DataFormatError(
                path, f"{text!r} is not an integer image id", line=number
            ) from None
    if len(ids) == n_captions:
        per_image = ids[::captions_per_image]
        for j, value in enumerate(ids):
            if value != per_image[j // captions_per_image]:
                raise DataFormatError(
                    path,
                    f"id {value} differs from {per_image[j // captions_per_image]} on line "
                    f"{j // captions_per_image * captions_per_image + 1}; expected the "
                    f"{captions_per_image} captions of an image to share its id "
                    "(one-id-per-caption layout)",
                    line=j + 1,
                )
        return per_image
    if len(ids) == n_images:
        return ids
    raise DataFormatError(
        path,
        f"has {len(ids)} ids; expected one per caption ({n_captions}) or one per image "
        f"({n_images})",
    )


class PrecompDataset(RetrievalDataset):
    """A split of a SCAN / VSE-infinity precomputed folder (see the module docstring).

    Args:
        root: The data folder.
        split: One of :data:`SPLITS`.
        encoder: Turns caption strings into token ids; without one items carry the text.
        captions_per_image: Consecutive captions per image in ``{split}_caps.txt``.
        max_images: Keep only the first images and their captions (model selection on the
            first 5000 dev captions uses 1000).
        mmap: Memory-map the features; False loads them into memory.

    Raises:
        ValueError: An unknown split or a bad count argument.
        FileNotFoundError: A required file is missing.
        DataFormatError: A file is malformed or the files disagree in size.
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        *,
        encoder: CaptionEncoder | None = None,
        captions_per_image: int = 5,
        max_images: int | None = None,
        mmap: bool = True,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not isinstance(captions_per_image, int) or captions_per_image < 1:
            raise ValueError(
                f"captions_per_image must be a positive int, got {captions_per_image!r}"
            )
        self.root = Path(root)
        self.split = split
        self.encoder = encoder
        self.captions_per_image = captions_per_image
        ims_path = self.root / f"{split}_ims.npy"
        caps_path = self.root / f"{split}_caps.txt"
        ids_path = self.root / f"{split}_ids.txt"

        array = load_feature_array(ims_path, mmap=mmap)
        n_img = array.shape[0]
        captions = read_lines(caps_path, f"one caption per line, {captions_per_image} per image")
        for number, text in enumerate(captions, start=1):
            if not text.strip():
                raise DataFormatError(
                    caps_path, "empty caption; expected one caption per line", line=number
                )
        if len(captions) % captions_per_image:
            raise DataFormatError(
                caps_path,
                f"has {len(captions)} captions, which do not divide into blocks of "
                f"{captions_per_image} per image",
            )
        if len(captions) != captions_per_image * n_img:
            raise DataFormatError(
                caps_path,
                f"has {len(captions)} captions for {n_img} images in {ims_path.name}; expected "
                f"{captions_per_image * n_img} ({captions_per_image} per image)",
            )
        if ids_path.is_file():
            image_ids: list[Any] = parse_precomp_ids(
                ids_path,
                n_captions=len(captions),
                n_images=n_img,
                captions_per_image=captions_per_image,
            )
        else:
            image_ids = list(range(n_img))
        self.has_ids_file = ids_path.is_file()

        if max_images is not None:
            if not isinstance(max_images, int) or max_images < 1:
                raise ValueError(f"max_images must be a positive int, got {max_images!r}")
            n_img = min(n_img, max_images)
            captions = captions[: n_img * captions_per_image]
            image_ids = image_ids[:n_img]
        self.captions = captions
        self.image_ids = image_ids
        self.txt_to_img = torch.arange(len(captions), dtype=torch.long) // captions_per_image
        self.feature_shape = tuple(array.shape[1:])
        self._features = LazyFeatures(ims_path, mmap=mmap, array=array)

    @property
    def array(self) -> np.ndarray:
        """The feature array as stored (an ``np.memmap`` unless ``mmap=False``)."""
        return self._features.array

    def check_features(
        self, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> None:
        """The size check, then a scan of rows ``0 .. num_images`` of ``{split}_ims.npy``.

        Args:
            in_dim: The model's ``model.image.in_dim``; None skips the size check.
            chunk_bytes: Bytes of features scanned at a time.

        Raises:
            DataFormatError: A NaN or inf (file, row, region, dimension named), or another
                feature size.
        """
        path = self._features.path
        check_feature_size(path, self.array.shape, in_dim)
        bad = find_non_finite(self.array, stop=self.num_images, chunk_bytes=chunk_bytes)
        if bad is not None:
            raise DataFormatError(path, bad.describe(f"image {bad.row}", "region"), row=bad.row)

    def image(self, index: int) -> torch.Tensor:
        """Float32 features of image ``index``: ``(R, D)`` regions or ``(D,)``."""
        if not 0 <= index < self.num_images:
            raise IndexError(f"image index {index} out of range for {self.num_images} images")
        return self._features.row(index)


def load_precomp_captions(
    root: str | Path, splits: Sequence[str] = VOCAB_SPLITS, *, captions_per_image: int = 5
) -> list[str]:
    """The captions a vocabulary is built from, validated against their features.

    Args:
        root: The data folder.
        splits: The splits to read (never a test split by default).
        captions_per_image: Consecutive captions per image.

    Returns:
        The captions, split after split.
    """
    out: list[str] = []
    for split in splits:
        out.extend(PrecompDataset(root, split, captions_per_image=captions_per_image).captions)
    return out


__all__ = [
    "SPLITS",
    "CaptionEncoder",
    "CaptionView",
    "DataFormatError",
    "ImageView",
    "NonFinite",
    "PrecompDataset",
    "RetrievalBatch",
    "RetrievalDataset",
    "RetrievalItem",
    "check_features",
    "collate_retrieval",
    "find_non_finite",
    "load_precomp_captions",
    "pad_captions",
]
