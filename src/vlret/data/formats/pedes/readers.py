"""Person-search data sets (CUHK-PEDES, ICFG-PEDES, RSTPReid) as retrieval data sets.

One item per caption (:class:`~vlret.data.dataset.RetrievalDataset`), one image per record of
the split (:mod:`.common`), in file order. Besides the retrieval contract a split carries:

* ``image_identity``: the raw person id of each image, as the annotation file writes it
  (evaluation: every image of the caption's person is a correct answer);
* ``identity``: each image's person relabelled ``0..N-1`` over the split (the training
  identity on the train split: IRRA's ``id - 1`` on CUHK-PEDES), and ``raw_identities`` the
  raw id of each label;
* batches (:meth:`PersonSearchDataset.collate`, the ``collate_fn`` the trainer's loader uses)
  with ``RetrievalBatch.identity`` set, so every pair of one person is a positive.

Images come from ``image_root`` (the data folder's ``imgs/`` by default) through the model's
image transform, or, for the precomputed-feature route, from ``features_dir/{split}_ims.npy``:
one feature row per image of the split in the order above (the precomputed format's
convention, :mod:`vlret.data.formats.precomp`; split names ``train``, ``val``, ``test``). Every
image
file of the split is checked to exist when the split is opened; the error names the
annotation file, the record and its ``file_path`` / ``img_path``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...bad_samples import SkipsBadImages
from ...checks import (
    SCAN_CHUNK_BYTES,
    DataFormatError,
    check_feature_size,
    check_in_dim,
    find_non_finite,
    load_feature_array,
)
from ...dataset import CaptionEncoder, LazyFeatures, RetrievalBatch, RetrievalItem
from .common import (
    IMAGE_FOLDER,
    PedesData,
    PedesImage,
    default_annotations,
    identity_labels,
    layout_of,
    read_pedes_json,
    split_value,
)


class PersonSearchDataset(SkipsBadImages):
    """One split of a person-search annotation file (module docstring). A training split read
    from image files skips and counts its bad images
    (:meth:`~vlret.data.bad_samples.SkipsBadImages.skip_bad_images`); elsewhere a bad image is
    the one-line :class:`~vlret._images.ImageReadError` naming the file.

    Args:
        source: The annotation JSON or its parsed :class:`~vlret.data.formats.pedes.PedesData`.
        split: ``train``, ``val`` (also ``dev``; not on ICFG-PEDES) or ``test``.
        format: ``cuhk-pedes``, ``icfg-pedes`` or ``rstpreid`` (ignored for parsed data).
        image_root: The image folder; default the annotation file's folder's ``imgs/``.
        image_transform: Maps an image path to the model's input; None serves the path.
        encoder: Turns captions into token ids; without one items carry the text.
        features_dir: The folder of ``{split}_ims.npy`` (precomputed features instead of
            images; no image file is read nor checked).
        max_images: Keep only the first images of the split and their captions.
        check_images: Check that every image file exists when the split is opened.
        mmap: Memory-map the features.

    Raises:
        ValueError: An unknown split or format, ``val`` on ICFG-PEDES, a bad ``max_images``.
        FileNotFoundError: The annotation file, the image folder or the features are missing.
        DataFormatError: The annotation file is malformed (:func:`read_pedes_json`), has no
            record of the split, an image file is missing, or the features have another
            number of rows than the split has images (a duplicated image file, whose records
            are one image, named with its records).
    """

    def __init__(
        self,
        source: str | Path | PedesData,
        split: str,
        *,
        format: str = "cuhk-pedes",
        image_root: str | Path | None = None,
        image_transform: Callable[[Path], Any] | None = None,
        encoder: CaptionEncoder | None = None,
        features_dir: str | Path | None = None,
        max_images: int | None = None,
        check_images: bool = True,
        mmap: bool = True,
    ) -> None:
        self.data = source if isinstance(source, PedesData) else read_pedes_json(source, format)
        self.format = self.data.format
        self.split = split
        split_value(self.format, split)  # the refusal of val on ICFG-PEDES, before the file
        if max_images is not None and (
            isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 1
        ):
            raise ValueError(f"max_images must be a positive int or None, got {max_images!r}")
        self.entries = self.data.split(split)[:max_images]
        self.encoder = encoder
        self.image_transform = image_transform
        self.image_root = Path(
            image_root if image_root is not None else self.data.path.parent / IMAGE_FOLDER
        )
        captions: list[str] = []
        txt_to_img: list[int] = []
        for i, im in enumerate(self.entries):
            captions.extend(im.captions)
            txt_to_img.extend([i] * len(im.captions))
        self.captions = captions
        self.txt_to_img = torch.tensor(txt_to_img, dtype=torch.long)
        self.image_ids = [im.path for im in self.entries]
        persons = [im.person for im in self.entries]
        self.image_identity = torch.tensor(persons, dtype=torch.long)
        labels, raw = identity_labels(persons)
        #: Each image's person relabelled 0..N-1 over this split, in raw-id order.
        self.identity = torch.tensor(labels, dtype=torch.long)
        #: The raw person id of each label.
        self.raw_identities = raw
        self._features: LazyFeatures | None = None
        if features_dir is not None:
            self._features = self._open_features(Path(features_dir), mmap=mmap)
        elif check_images:
            self.check_images()

    @property
    def num_identities(self) -> int:
        """Number of persons in the split."""
        return len(self.raw_identities)

    def _open_features(self, folder: Path, *, mmap: bool) -> LazyFeatures:
        path = folder / f"{split_value(self.format, self.split)}_ims.npy"
        array = load_feature_array(path, mmap=mmap)
        images = self.data.split(self.split)
        if array.shape[0] != len(images):
            raise DataFormatError(path, self._row_count_message(array.shape[0], images))
        return LazyFeatures(path, mmap=mmap, array=array)

    def _row_count_message(self, rows: int, images: list[PedesImage]) -> str:
        """Why ``rows`` feature rows do not fit ``images``; a duplicated image file (records
        joined into one image) is named, with its records, as the likely cause."""
        expected = (
            f"expected one per image of the {self.split} split of {self.data.path} "
            f"({len(images)}, in the file's record order)"
        )
        joined = [im for im in images if im.merged]
        if not joined:
            return f"has {rows} rows; {expected}"
        first, key = joined[0], self.data.layout.path_key
        numbers = [str(r) for r in (first.record, *first.merged)]
        records = ", ".join(numbers[:-1]) + f" and {numbers[-1]}"
        n_records = len(images) + sum(len(im.merged) for im in joined)
        per_record = f", one per record ({n_records})," if rows == n_records else ""
        return (
            f"has {rows} rows{per_record} but records {records} have the same {key} "
            f"{first.path!r} and are one image (their captions joined; {len(joined)} duplicate "
            f"{key} value{'s' if len(joined) > 1 else ''} in the split); {expected}"
        )

    def check_images(self) -> None:
        """Check that every image file of the split exists (one ``stat`` per image).

        Raises:
            FileNotFoundError: The image folder is missing.
            DataFormatError: An image file is missing; the error names the annotation file,
                the record, its key and the path, and how many are missing.
        """
        if not self.image_root.is_dir():
            raise FileNotFoundError(
                f"{self.image_root}: missing; expected the image folder of {self.data.path} "
                "(data.image_root)"
            )
        missing = [im for im in self.entries if not (self.image_root / im.path).is_file()]
        if missing:
            first = missing[0]
            raise self.data.error(
                first.record,
                layout_of(self.format).path_key,
                f"image file {self.image_root / first.path} is missing ({len(missing)} of the "
                f"{len(self.entries)} images of the {self.split} split are missing under "
                f"{self.image_root})",
            )

    @property
    def reads_image_files(self) -> bool:
        """Whether items are read from image files (not ``features_dir``)."""
        return self._features is None

    @property
    def bad_listing(self) -> Path:
        """The annotation file."""
        return self.data.path

    def image_path(self, index: int) -> Path:
        """The file of image ``index``."""
        return self.image_root / self.entries[index].path

    def image_source(self, index: int) -> Path:
        """The file of image ``index`` (what training augmentation reads)."""
        if self._features is not None:
            raise ValueError(
                f"this {self.data.layout.title} split reads precomputed features "
                "(data.features_dir): there are no images to augment"
            )
        path = self.image_path(index)
        if not path.is_file():
            im = self.entries[index]
            raise FileNotFoundError(
                f"{path}: missing; expected the image of record {im.record} of {self.data.path}"
            )
        return path

    def image(self, index: int) -> Any:
        """Image ``index``: its feature row, ``image_transform(path)`` or its path."""
        if self._features is not None:
            if not 0 <= index < self.num_images:
                raise IndexError(f"image index {index} out of range for {self.num_images} images")
            return self._features.row(index)
        path = self.image_source(index)
        return self.image_transform(path) if self.image_transform is not None else path

    def collate(self, items: Sequence[RetrievalItem]) -> RetrievalBatch:
        """The retrieval batch with ``identity``: each item's person, relabelled 0..N-1."""
        batch = super().collate(items)
        batch.identity = self.identity[batch.img_index]
        return batch

    def check_features(
        self, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> None:
        """Precomputed features: their size and a NaN / inf scan; images: that the files
        exist (``in_dim`` is then validated as an argument only).

        Args:
            in_dim: The model's ``model.image.in_dim``; None skips the size check.
            chunk_bytes: Bytes of features scanned at a time.

        Raises:
            DataFormatError: A NaN or inf, another feature size, or a missing image file.
        """
        check_in_dim(in_dim)
        if self._features is None:
            self.check_images()
            return
        array: np.ndarray = self._features.array
        check_feature_size(self._features.path, array.shape, in_dim)
        bad = find_non_finite(array, stop=self.num_images, chunk_bytes=chunk_bytes)
        if bad is not None:
            raise DataFormatError(
                self._features.path, bad.describe(f"image {bad.row}", "region"), row=bad.row
            )


class CUHKPedesDataset(PersonSearchDataset):
    """A split of CUHK-PEDES (``reid_raw.json``); arguments as :class:`PersonSearchDataset`."""

    def __init__(self, source: str | Path | PedesData, split: str, **options: Any) -> None:
        super().__init__(source, split, format="cuhk-pedes", **options)


class ICFGPedesDataset(PersonSearchDataset):
    """A split of ICFG-PEDES (``ICFG-PEDES.json``; train and test only); arguments as
    :class:`PersonSearchDataset`."""

    def __init__(self, source: str | Path | PedesData, split: str, **options: Any) -> None:
        super().__init__(source, split, format="icfg-pedes", **options)


class RSTPReidDataset(PersonSearchDataset):
    """A split of RSTPReid (``data_captions.json``, ``img_path``); arguments as
    :class:`PersonSearchDataset`."""

    def __init__(self, source: str | Path | PedesData, split: str, **options: Any) -> None:
        super().__init__(source, split, format="rstpreid", **options)


#: The data set class of each format.
DATASETS: dict[str, type[PersonSearchDataset]] = {
    "cuhk-pedes": CUHKPedesDataset,
    "icfg-pedes": ICFGPedesDataset,
    "rstpreid": RSTPReidDataset,
}


def open_person_search(
    format: str,
    root: str | Path,
    split: str,
    *,
    annotations: str | Path | None = None,
    **options: Any,
) -> PersonSearchDataset:
    """One split of a person-search data folder.

    Args:
        format: ``cuhk-pedes``, ``icfg-pedes`` or ``rstpreid``.
        root: The data folder (holding the annotation file and ``imgs/``).
        split: ``train``, ``val`` / ``dev`` or ``test``.
        annotations: The annotation file; default the format's standard name under ``root``
            (:func:`~vlret.data.formats.pedes.default_annotations`).
        **options: The other arguments of :class:`PersonSearchDataset` (``image_root``
            defaults to ``root/imgs``).

    Returns:
        The split, as the format's class (e.g. :class:`CUHKPedesDataset`).
    """
    path = Path(annotations) if annotations is not None else default_annotations(format, root)
    if options.get("image_root") is None:
        options["image_root"] = Path(root) / IMAGE_FOLDER
    layout_of(format)  # an unknown format named before the file is read
    return DATASETS[format](path, split, **options)


def person_search_vocab_captions(format: str, root: str | Path, **kwargs: Any) -> list[str]:
    """The captions a vocabulary is built from: train and val (never test).

    Args:
        format: ``cuhk-pedes``, ``icfg-pedes`` or ``rstpreid``.
        root: The data folder.
        **kwargs: ``annotations`` (as :func:`open_person_search`).

    Returns:
        The captions.
    """
    path = kwargs.get("annotations") or default_annotations(format, root)
    data = read_pedes_json(path, format)
    splits = [s for s in ("train", "val") if s in data.layout.splits]
    return [c for s in splits for im in data.split(s) for c in im.captions]


__all__ = [
    "CUHKPedesDataset",
    "ICFGPedesDataset",
    "PersonSearchDataset",
    "RSTPReidDataset",
    "open_person_search",
    "person_search_vocab_captions",
]
