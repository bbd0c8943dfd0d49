"""SCAN / VSE-infinity precomputed features (memory-mapped), one split at a time.

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

The format-independent dataset contract (:class:`~vlret.data.dataset.RetrievalDataset`, its
batches and views) is :mod:`vlret.data.dataset`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..captioning_files import read_captions_file, split_captions_args
from ..checks import (
    SCAN_CHUNK_BYTES,
    DataFormatError,
    check_feature_size,
    find_non_finite,
    load_feature_array,
    read_lines,
)
from ..dataset import CaptionEncoder, LazyFeatures, RetrievalDataset
from ..vocab import DEFAULT_MIN_COUNT, VOCAB_SPLITS, Vocabulary, build_vocab, check_vocab_splits
from .registry import DataFormat, OpenRequest, register_format

SPLITS = ("train", "dev", "test", "testall")


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


def _read_caps(caps_path: Path, captions_per_image: int, n_img: int, ims_path: Path) -> list[str]:
    """``{split}_caps.txt``: no empty caption, ``captions_per_image`` per image of the split."""
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
    return captions


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
        captions_file: Read the split's captions from this captions file
            (:mod:`vlret.data.captioning_files`: one per line, its own ``k`` per image, in the
            rows' order) instead of ``{split}_caps.txt``; ``captions_per_image`` then only
            reads the per-caption layout of ``{split}_ids.txt``.
        captions_key: What names ``captions_file`` in error messages
            (``"data.train_captions"``).

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
        captions_file: str | Path | None = None,
        captions_key: str = "captions_file",
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
        annotated_k = captions_per_image  # the annotations' k, which {split}_ids.txt follows
        if captions_file is not None:
            read = read_captions_file(
                captions_file, num_images=n_img, split=split, key=captions_key
            )
            captions, captions_per_image = read.captions, read.captions_per_image
            self.captions_per_image = captions_per_image
            self.captions_file: Path | None = read.path
        else:
            self.captions_file = None
            captions = _read_caps(caps_path, captions_per_image, n_img, ims_path)
        if ids_path.is_file():
            image_ids: list[Any] = parse_precomp_ids(
                ids_path,
                n_captions=annotated_k * n_img,
                n_images=n_img,
                captions_per_image=annotated_k,
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


def build_precomp_vocab(
    root: str | Path, *, splits: Sequence[str] = VOCAB_SPLITS, min_count: int = DEFAULT_MIN_COUNT
) -> Vocabulary:
    """Build a vocabulary from a precomputed folder's captions
    (:func:`~vlret.data.vocab.build_vocab`).

    Args:
        root: The precomputed data folder (captions are checked against their features).
        splits: The splits to count; test splits are refused.
        min_count: The least number of occurrences a kept word has.

    Returns:
        The vocabulary, with the ``"vlret"`` tokeniser.

    Raises:
        ValueError: A test split, or ``min_count`` not a positive int.
        FileNotFoundError: A split's files are missing.
        DataFormatError: A split's files are malformed or disagree.
    """
    check_vocab_splits(splits)
    return build_vocab(load_precomp_captions(root, splits), min_count=min_count)


def _open(data: Any, split: str, request: OpenRequest) -> PrecompDataset:
    return PrecompDataset(
        request.root,
        split,
        encoder=request.encoder,
        captions_per_image=data.captions_per_image,
        max_images=request.max_images,
        **split_captions_args(data, split),
    )


def _vocabulary(data: Any) -> Vocabulary:
    """The train split's captions, and the dev split's where its captions file is there."""
    root = Path(data.root)
    splits = [data.train_split]
    if data.dev_split and (root / f"{data.dev_split}_caps.txt").is_file():
        splits.append(data.dev_split)
    captions = load_precomp_captions(root, splits, captions_per_image=data.captions_per_image)
    return build_vocab(captions, min_count=data.min_count)


def _data_set(data: Mapping[str, Any], root: str | None) -> str | None:
    """``"coco"`` when the folder is named so (SCAN's and VSE-infinity's ``coco_precomp``): the
    files do not tell (a Flickr30K-like folder may hold a ``testall`` split too)."""
    folder = root or data.get("root")
    if not isinstance(folder, str) or not folder:
        return None
    return "coco" if "coco" in Path(folder).name.lower() else None


#: SCAN / VSE-infinity's precomputed region features (``data.format = "precomp"``).
PRECOMP = register_format(
    DataFormat(
        name="precomp",
        summary="SCAN / VSE-infinity precomputed features: {split}_ims.npy and {split}_caps.txt",
        reader=__name__,
        open=_open,
        splits=SPLITS,
        inputs="features",
        caption_count_key="captions_per_image",
        noise_index=True,
        captions_files=True,
        offline_negatives=True,
        reads_root=True,
        vocabulary=_vocabulary,
        data_set=_data_set,
    )
)


__all__ = [
    "PRECOMP",
    "SPLITS",
    "VOCAB_SPLITS",
    "PrecompDataset",
    "build_precomp_vocab",
    "load_precomp_captions",
    "parse_precomp_ids",
]
