"""Image-caption pairs from a CSV / TSV file (open_clip's ``--csv-*`` convention).

A header row names the columns; ``img_key`` (open_clip's ``--csv-img-key``, default
``filepath``) holds the image path and ``caption_key`` (``--csv-caption-key``, default
``title``) the caption; ``separator`` is ``"\\t"`` by default (``--csv-separator``). Other
columns are ignored. Fields are read with Python's ``csv`` module (quoted fields may hold the
separator). A relative image path is taken relative to ``image_root`` when given, else to the
file's folder (open_clip takes it relative to the working directory; a CSV written next to its
images then works from anywhere).

Rows naming the same image file are one image with several captions (a COCO-style CSV with five
rows per image evaluates as 5 captions per image); each row is one item. Training reads it
through the map-style sampler like every other format.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checks import SCAN_CHUNK_BYTES, DataFormatError, check_in_dim
from .dataset import CaptionEncoder, RetrievalDataset


@dataclass(frozen=True)
class CsvPair:
    """One row: the image path as written, its caption and the row's 1-based line."""

    image: str
    caption: str
    line: int


def read_csv_pairs(
    path: str | Path,
    *,
    img_key: str = "filepath",
    caption_key: str = "title",
    separator: str = "\t",
) -> list[CsvPair]:
    """Read the ``(image path, caption)`` rows of a CSV / TSV file.

    Args:
        path: The file.
        img_key: The column of image paths.
        caption_key: The column of captions.
        separator: The field separator (one character).

    Returns:
        The rows in file order.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: No header with both columns, a short row, an empty image path or
            caption (naming the line), or no row at all.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected a CSV/TSV of image paths and captions")
    if len(separator) != 1:
        raise ValueError(f"separator must be one character, got {separator!r}")
    rows: list[CsvPair] = []
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter=separator)
        try:
            header = next(reader, None)
            if header is None:
                raise DataFormatError(path, "is empty; expected a header row and pairs")
            for key, what in ((img_key, "csv_img_key"), (caption_key, "csv_caption_key")):
                if key not in header:
                    raise DataFormatError(
                        path,
                        f"header has no column {key!r} (data.{what}); columns: "
                        f"{', '.join(repr(h) for h in header)} (separator {separator!r})",
                        line=1,
                    )
            i_img, i_cap = header.index(img_key), header.index(caption_key)
            for fields in reader:
                line = reader.line_num
                if not fields:
                    continue
                if len(fields) <= max(i_img, i_cap):
                    raise DataFormatError(
                        path, f"{len(fields)} fields; expected {len(header)}", line=line
                    )
                image, caption = fields[i_img].strip(), fields[i_cap].strip()
                if not image or not caption:
                    empty = img_key if not image else caption_key
                    raise DataFormatError(path, f"empty {empty!r}", line=line)
                rows.append(CsvPair(image, caption, line))
        except (csv.Error, UnicodeDecodeError) as err:
            raise DataFormatError(path, f"unreadable ({err})", line=reader.line_num) from None
    if not rows:
        raise DataFormatError(path, "has a header but no pairs")
    return rows


class CsvPairsDataset(RetrievalDataset):
    """The pairs of a CSV / TSV file as a :class:`RetrievalDataset` (module docstring).

    ``image(i)`` is ``image_transform(path)`` or the path without a transform; ``image_ids``
    are the paths as written in the file.

    Args:
        path: The CSV / TSV file.
        img_key: The column of image paths.
        caption_key: The column of captions.
        separator: The field separator.
        image_root: The folder relative image paths start from (default: the file's folder).
        image_transform: Maps an image path to the model's input.
        encoder: Turns caption strings into token ids.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        img_key: str = "filepath",
        caption_key: str = "title",
        separator: str = "\t",
        image_root: str | Path | None = None,
        image_transform: Callable[[Path], Any] | None = None,
        encoder: CaptionEncoder | None = None,
    ) -> None:
        self.path = Path(path)
        self.rows = read_csv_pairs(
            self.path, img_key=img_key, caption_key=caption_key, separator=separator
        )
        self.image_root = Path(image_root) if image_root is not None else self.path.parent
        self.image_transform = image_transform
        self.encoder = encoder
        index: dict[str, int] = {}
        txt_to_img = []
        for row in self.rows:
            txt_to_img.append(index.setdefault(row.image, len(index)))
        self.image_ids = list(index)
        self._first_line = {}
        for row in reversed(self.rows):
            self._first_line[row.image] = row.line
        self.captions = [row.caption for row in self.rows]
        self.txt_to_img = torch.tensor(txt_to_img, dtype=torch.long)

    def image_path(self, index: int) -> Path:
        """The file of image ``index``."""
        return self.image_root / self.image_ids[index]

    def image_source(self, index: int) -> Path:
        """The file of image ``index``, checked to exist."""
        path = self.image_path(index)
        if not path.is_file():
            line = self._first_line[self.image_ids[index]]
            raise FileNotFoundError(
                f"{path}: missing; expected the image of line {line} of {self.path}"
            )
        return path

    def image(self, index: int) -> Any:
        """Image ``index`` as ``image_transform(path)``, or its path without a transform."""
        path = self.image_source(index)
        return self.image_transform(path) if self.image_transform is not None else path

    def check_features(
        self, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> None:
        """Check that every image file exists (``in_dim`` and ``chunk_bytes`` as for
        :meth:`RetrievalDataset.check_features`; raw images have no features to scan).

        Raises:
            DataFormatError: An image file is missing (naming its line and the count).
        """
        check_in_dim(in_dim)
        ids = self.image_ids[: self.num_images]
        missing = [name for name in ids if not (self.image_root / name).is_file()]
        if missing:
            first = missing[0]
            raise DataFormatError(
                self.path,
                f"image file {self.image_root / first} is missing; {len(missing)} of the "
                f"{len(ids)} images are missing under {self.image_root}",
                line=self._first_line[first],
            )


def _resolve(root: str, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path(root) / p


def build_csv_dataset(
    data: Any,
    split: str,
    encoder: Any,
    *,
    image_transform: Any = None,
) -> CsvPairsDataset:
    """The ``train`` (``data.csv``) or ``dev`` (``data.dev_csv``, its first
    ``data.dev_max_images`` images) set of a ``[data]`` section with ``format = "csv"``;
    relative files are taken relative to ``data.root``.

    Raises:
        ValueError: ``split`` is neither, or its file is not configured.
    """
    if split not in ("train", "dev"):
        raise ValueError(f"format 'csv' has the splits 'train' (data.csv) and 'dev', got {split!r}")
    name = data.csv if split == "train" else data.dev_csv
    if name is None:
        raise ValueError(f"format 'csv' needs data.{'csv' if split == 'train' else 'dev_csv'}")
    ds = CsvPairsDataset(
        _resolve(data.root, name),
        img_key=data.csv_img_key,
        caption_key=data.csv_caption_key,
        separator=data.csv_separator,
        image_root=data.image_root,
        image_transform=image_transform,
        encoder=encoder,
    )
    keep = data.dev_max_images if split == "dev" else None
    if keep is not None and keep < ds.num_images:  # model selection on the first images
        mask = ds.txt_to_img < keep
        ds.captions = [c for c, k in zip(ds.captions, mask.tolist(), strict=True) if k]
        ds.txt_to_img = ds.txt_to_img[mask]
        ds.image_ids = ds.image_ids[:keep]
    return ds


__all__ = ["CsvPair", "CsvPairsDataset", "build_csv_dataset", "read_csv_pairs"]
