"""Karpathy split JSON plus an image folder (``data.format = "karpathy"``): the split as a
retrieval dataset, its vocabulary, and the format's record.

The JSON is parsed by :mod:`vlret.data.formats.karpathy_json`. The image file is
``image_root/filepath/filename`` (COCO) or ``image_root/filename``.

Our splits: ``train`` = Karpathy train + restval (COCO's 113,287 images; F30K's 29,000),
``dev`` = val, ``test`` = test (COCO's 5000 images are the precomputed ``testall``, so
``testall`` is accepted as another name for it). COCO images with 6 or 7 captions keep their
first ``captions_per_image`` (5).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..bad_samples import SkipsBadImages
from ..captioning_files import read_captions_file, split_captions_args
from ..checks import SCAN_CHUNK_BYTES, DataFormatError, check_in_dim
from ..dataset import CaptionEncoder, RetrievalDataset, first_images
from ..transforms import capped
from ..vocab import DEFAULT_MIN_COUNT, Vocabulary, build_vocab
from .karpathy_json import (
    SPLIT_MEMBERS,
    KarpathyData,
    read_karpathy_json,
)
from .registry import DataFormat, MissingDataKey, OpenRequest, register_format


def _as_data(source: str | Path | KarpathyData) -> KarpathyData:
    return source if isinstance(source, KarpathyData) else read_karpathy_json(source)


class KarpathyDataset(SkipsBadImages):
    """One split of a Karpathy JSON, for end-to-end fine-tuning (e.g. CLIP) on image files.

    ``image(i)`` is ``image_transform(path)`` (e.g. PIL loading and CLIP preprocessing, which
    live with the encoders) or, without a transform, the image's ``Path``. A run puts the
    transform behind ``data.max_image_pixels`` (:func:`vlret.data.transforms.capped`): an
    image over the cap, or one that does not decode, is one line naming its file
    (:class:`vlret._images.ImageReadError`), except in a training split, which skips and counts
    it (:meth:`~vlret.data.bad_samples.SkipsBadImages.skip_bad_images`). ``text_field`` picks
    ``raw`` captions or ``tokens`` joined by spaces. ``image_ids`` are ``cocoid`` for COCO and
    ``imgid`` otherwise (the ids that ``{split}_ids.txt`` of the precomputed format uses).

    Args:
        source: The JSON file or its parsed :class:`KarpathyData`.
        split: One of our splits (:meth:`KarpathyData.split`).
        image_root: The image folder; without it only captions are served.
        image_transform: Maps an image path to the model's input.
        encoder: Turns caption strings into token ids (a vocabulary or tokenizer).
        captions_per_image: Captions kept per image (the first ones); None keeps all.
        text_field: ``"raw"`` or ``"tokens"``.
        include_restval: Whether ``"train"`` includes restval.
        captions_file: Read the split's captions from this captions file
            (:mod:`vlret.data.captioning_files`: one per line, its own ``k`` per image, the
            split's images in JSON order) instead of the JSON's sentences
            (``captions_per_image`` and ``text_field`` then do not apply).
        captions_key: What names ``captions_file`` in error messages
            (``"data.train_captions"``).

    Raises:
        ValueError: A bad ``text_field`` or ``captions_per_image``, or an unknown split.
        DataFormatError: The JSON is malformed.
    """

    def __init__(
        self,
        source: str | Path | KarpathyData,
        split: str,
        *,
        image_root: str | Path | None = None,
        image_transform: Callable[[Path], Any] | None = None,
        encoder: CaptionEncoder | None = None,
        captions_per_image: int | None = 5,
        text_field: str = "raw",
        include_restval: bool = True,
        captions_file: str | Path | None = None,
        captions_key: str = "captions_file",
    ) -> None:
        if text_field not in ("raw", "tokens"):
            raise ValueError(f"text_field must be 'raw' or 'tokens', got {text_field!r}")
        if captions_per_image is not None and (
            not isinstance(captions_per_image, int) or captions_per_image < 1
        ):
            raise ValueError(
                f"captions_per_image must be a positive int or None, got {captions_per_image!r}"
            )
        self.data = _as_data(source)
        self.split = split
        self.image_root = Path(image_root) if image_root is not None else None
        if self.image_root is not None and not self.image_root.is_dir():
            raise FileNotFoundError(f"{self.image_root}: missing; expected the image folder")
        self.image_transform = image_transform
        self.encoder = encoder
        self.entries = self.data.split(split, include_restval=include_restval)
        if not self.entries:
            members = self.data.split_members(split, include_restval=include_restval)
            raise DataFormatError(
                self.data.path,
                f"has no images for the split {split!r} (Karpathy split "
                f"{' + '.join(repr(m) for m in members)}); expected at least one",
            )
        self.captions_per_image = captions_per_image
        self.captions_file: Path | None = None
        if captions_file is not None:
            read = read_captions_file(
                captions_file, num_images=len(self.entries), split=split, key=captions_key
            )
            self.captions, self.captions_per_image = read.captions, read.captions_per_image
            self.captions_file = read.path
            self.txt_to_img = torch.arange(len(read.captions)) // read.captions_per_image
        else:
            self.captions, txt_to_img = self._sentences(captions_per_image, text_field)
            self.txt_to_img = torch.tensor(txt_to_img, dtype=torch.long)
        self.image_ids = [im.cocoid if im.cocoid is not None else im.imgid for im in self.entries]

    def _sentences(
        self, captions_per_image: int | None, text_field: str
    ) -> tuple[list[str], list[int]]:
        """The JSON's captions of the split's images and the image of each."""
        captions: list[str] = []
        txt_to_img: list[int] = []
        for i, im in enumerate(self.entries):
            sents = im.sentences
            if captions_per_image is not None:
                if len(sents) < captions_per_image:
                    raise DataFormatError(
                        self.data.path,
                        f"image imgid {im.imgid} ({im.filename}) has {len(sents)} sentences; "
                        f"expected at least {captions_per_image}",
                    )
                sents = sents[:captions_per_image]
            for s in sents:
                captions.append(s.raw.strip() if text_field == "raw" else " ".join(s.tokens))
                txt_to_img.append(i)
        return captions, txt_to_img

    @property
    def reads_image_files(self) -> bool:
        """Whether items are read from image files (built with ``image_root``)."""
        return self.image_root is not None

    @property
    def bad_listing(self) -> Path:
        """The Karpathy JSON."""
        return self.data.path

    def image_path(self, index: int) -> Path:
        """The file of image ``index``; raises ``ValueError`` without ``image_root``."""
        if self.image_root is None:
            raise ValueError("this KarpathyDataset was built without image_root")
        return self.entries[index].path(self.image_root)

    def image(self, index: int) -> Any:
        """Image ``index`` as ``image_transform(path)``, or its path without a transform.

        Args:
            index: The image's index in the split.

        Returns:
            The transformed image, or its ``Path``.

        Raises:
            ValueError: The dataset has no ``image_root``; through a capped transform, an
                image over the pixel cap or one that does not decode
                (:class:`vlret._images.ImageReadError`, naming the file).
            FileNotFoundError: The image file is missing.
        """
        path = self.image_source(index)
        return self.image_transform(path) if self.image_transform is not None else path

    def image_source(self, index: int) -> Path:
        """The file of image ``index``, checked to exist (what training augmentation reads,
        :meth:`RetrievalDataset.set_augment`; the train split's only)."""
        path = self.image_path(index)
        if not path.is_file():
            im = self.entries[index]
            raise FileNotFoundError(
                f"{path}: missing; expected the image file of imgid {im.imgid} listed in "
                f"{self.data.path}"
            )
        return path

    def check_features(
        self, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> None:
        """Check that every image file of the split exists (one ``stat`` per image).

        Raw images have no features to scan, so ``in_dim`` is not checked.

        Args:
            in_dim: The model's feature size (validated as an argument only).
            chunk_bytes: Unused here; the precomputed datasets' read size.

        Raises:
            DataFormatError: An image file is missing under ``image_root``.
        """
        check_in_dim(in_dim)
        if self.image_root is None:
            return
        entries = self.entries[: self.num_images]  # builders may keep only the first images
        missing = [im for im in entries if not im.path(self.image_root).is_file()]
        if missing:
            first = missing[0]
            raise DataFormatError(
                self.data.path,
                f"image file {first.path(self.image_root)} of imgid {first.imgid} is missing; "
                f"{len(missing)} of the {len(entries)} images of the {self.split} split are "
                f"missing under image_root {self.image_root}",
                line=self.data.line_of(first),
            )


def karpathy_vocab_captions(
    source: str | Path | KarpathyData,
    *,
    include_restval: bool = True,
    captions_per_image: int | None = 5,
) -> list[str]:
    """The captions a vocabulary is built from: train (+ restval) and val, never test.

    Args:
        source: The JSON file or its parsed :class:`KarpathyData`.
        include_restval: Whether to include restval.
        captions_per_image: The first captions of each image, as the datasets use; None
            keeps all.

    Returns:
        The raw captions.
    """
    data = _as_data(source)
    out: list[str] = []
    for name in ("train", "dev"):
        for im in data.split(name, include_restval=include_restval):
            out.extend(s.raw for s in im.sentences[:captions_per_image])
    return out


def build_karpathy_vocab(
    source: str | Path | KarpathyData,
    *,
    min_count: int = DEFAULT_MIN_COUNT,
    include_restval: bool = True,
    captions_per_image: int | None = 5,
) -> Vocabulary:
    """Vocabulary from the train (+ restval) and val captions of a Karpathy JSON.

    Args:
        source: The JSON file or its parsed :class:`KarpathyData`.
        min_count: Words seen fewer times map to ``<unk>``.
        include_restval: Whether to include restval.
        captions_per_image: As in :func:`karpathy_vocab_captions`.

    Returns:
        The vocabulary.
    """
    captions = karpathy_vocab_captions(
        source, include_restval=include_restval, captions_per_image=captions_per_image
    )
    return build_vocab(captions, min_count=min_count)


def _open(data: Any, split: str, request: OpenRequest) -> RetrievalDataset:
    json_path = Path(data.karpathy_json) if data.karpathy_json else request.root
    dataset = KarpathyDataset(
        json_path,
        split,
        image_root=data.image_root,
        image_transform=capped(request.image_transform, data.max_image_pixels),
        encoder=request.encoder,
        captions_per_image=data.captions_per_image,
        **split_captions_args(data, split),
    )
    return first_images(dataset, request.max_images)


class KarpathyJsonNotFound(FileNotFoundError):
    """A data folder without the one Karpathy JSON to evaluate (:func:`karpathy_at_root`);
    ``folder`` and the ``dataset_*.json`` files ``found`` there, for a caller's hint."""

    def __init__(self, message: str, *, folder: Path, found: list[Path]) -> None:
        super().__init__(message)
        self.folder, self.found = folder, found


def karpathy_at_root(data: Any, root: Path) -> Any:
    """A Karpathy run's data config pointed at the folder ``root``::

        root/
          dataset_<name>.json     the Karpathy JSON: the training config's file name, else the
                                  only dataset_*.json in root (root may also be the JSON file,
                                  and then its folder is the root)
          images/                 the image folder: the training config's image_root folder
                                  name, else images/, else root itself (COCO: root/val2014/...)

    Raises:
        KarpathyJsonNotFound: No JSON of that name, and not exactly one ``dataset_*.json``.
    """
    if root.is_file():
        json_path, folder = root, root.parent
    else:
        folder = root
        stored = Path(data.karpathy_json).name if data.karpathy_json else None
        if stored and (folder / stored).is_file():
            json_path = folder / stored
        else:
            found = sorted(folder.glob("dataset_*.json"))
            if len(found) != 1:
                want = stored or "dataset_<name>.json"
                raise KarpathyJsonNotFound(
                    f"{folder}: expected the Karpathy JSON {want} in this folder, found "
                    f"{[p.name for p in found] or 'none'}",
                    folder=folder,
                    found=found,
                )
            json_path = found[0]
    image_root = None
    if data.image_root is not None:
        candidates = [folder / Path(data.image_root).name, folder / "images", folder]
        image_root = next(str(c) for c in candidates if c.is_dir())
    return dataclasses.replace(
        data, root=str(folder), karpathy_json=str(json_path), image_root=image_root
    )


def _vocabulary(data: Any) -> Vocabulary:
    if data.karpathy_json is None:
        raise MissingDataKey("karpathy_json", "required for format 'karpathy'")
    return build_karpathy_vocab(data.karpathy_json, min_count=data.min_count)


def _data_set(data: Mapping[str, Any], root: str | None) -> str | None:
    """The JSON's ``dataset`` field (``"coco"``, ``"flickr30k"``; inferred as the reader does
    when missing: COCO entries carry a ``filepath``); while the file cannot be read, ``"coco"``
    when its name says so (``dataset_coco.json``)."""
    path = data.get("karpathy_json")
    if not isinstance(path, str) or not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            top = json.load(f)
    except (OSError, ValueError):  # not there yet, or broken: the reader names it later
        return "coco" if "coco" in Path(path).name.lower() else None
    if not isinstance(top, dict):
        return None
    dataset = top.get("dataset")
    if dataset is None:
        images = top.get("images")
        first = images[0] if isinstance(images, list) and images else None
        return "coco" if isinstance(first, dict) and "filepath" in first else None
    return dataset if isinstance(dataset, str) else None


#: Karpathy split JSON plus an image folder (``data.format = "karpathy"``).
KARPATHY = register_format(
    DataFormat(
        name="karpathy",
        summary="Karpathy split JSON (dataset_coco.json, dataset_flickr30k.json) + images",
        reader=__name__,
        open=_open,
        splits=tuple(SPLIT_MEMBERS),
        inputs="pixels",
        caption_count_key="captions_per_image",
        noise_index=True,
        captions_files=True,
        offline_negatives=True,
        vocabulary=_vocabulary,
        at_root=karpathy_at_root,
        data_set=_data_set,
    )
)


__all__ = [
    "KARPATHY",
    "KarpathyDataset",
    "KarpathyJsonNotFound",
    "build_karpathy_vocab",
    "karpathy_at_root",
    "karpathy_vocab_captions",
]
