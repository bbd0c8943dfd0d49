"""Image-caption pairs from a CSV / TSV file (open_clip's ``--csv-*`` convention).

A header row names the columns; ``img_key`` (open_clip's ``--csv-img-key``, default
``filepath``) holds the image path and ``caption_key`` (``--csv-caption-key``, default
``title``) the caption; ``separator`` is ``"\\t"`` by default (``--csv-separator``). Other
columns are ignored. Fields are read with Python's ``csv`` module as its writers write them
(``csv.writer`` with any quoting, a spreadsheet's export): a quoted field may hold the
separator and doubled quotes, line ends may be ``\\n`` or ``\\r\\n``, and a UTF-8 byte order mark
(what spreadsheets put first) is dropped. A relative image path is taken relative to
``image_root`` when given, else to the file's folder (open_clip takes it relative to the working
directory; a CSV written next to its images then works from anywhere).

**Line breaks inside fields.** A quote opened and not closed makes ``csv`` read on through the
separators and line ends that follow, to the next quote or to the end of the file, silently
merging those rows into one field. So a field holding a line break is refused (naming the line
where it starts and where it ends) unless ``multiline`` (``data.csv_multiline``) says fields
may hold line breaks; a quote never closed, which runs to the end of the file, is refused
either way. A file that is not UTF-8 is refused naming its first bad line.

Rows naming the same image file are one image with several captions (a COCO-style CSV with five
rows per image evaluates as 5 captions per image); each row is one item. Training reads it
through the map-style sampler like every other format.

**Bad images** (:mod:`vlret.data.bad_samples`, as in shards). Images are read with
:func:`vlret._images.open_rgb` under ``max_image_pixels`` (``data.max_image_pixels``). For
training (``skip_bad``) a row whose image is not an image, corrupt, unreadable or over the cap
is replaced in its batch by the next row of the file whose image reads, and counted in the
batch's ``skipped`` (so every rank keeps its batch size, and a resumed run replaces the same
rows); a missing image file is refused before training by :meth:`CsvPairsDataset.check_features`.
A dev set (:meth:`CsvPairsDataset.keep_readable`) reads each image once when it is built,
leaves the bad ones out (with their captions) and counts them in ``skipped``.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._images import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, open_rgb
from ..bad_samples import SkipsBadImages, check_dev_fraction
from ..checks import SCAN_CHUNK_BYTES, DataFormatError, check_in_dim
from ..dataset import CaptionEncoder
from ..paths import relative_path_hint
from .registry import DataFormat, OpenRequest, register_format


@dataclass(frozen=True)
class CsvPair:
    """One row: the image path as written, its caption, the row's 1-based first line and its
    last line (later than the first only where a field holds line breaks)."""

    image: str
    caption: str
    line: int
    end_line: int = 0


#: A last line fed to ``csv`` after the file's own: read as a row of its own unless a quote
#: opened in the file is still open, which then swallows it (private-use characters).
_END = "\ue000vlret: end of file\ue000"


class _LinesThenEnd:
    """The file's lines, then :data:`_END` on a line of its own; ``count``: the file's lines
    read so far."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.count, self.done = fh, 0, False

    def __iter__(self) -> Iterator[str]:
        last = ""
        for last in self.fh:
            self.count += 1
            yield last
        self.done = True
        if last and not last.endswith(("\n", "\r")):
            yield "\n"
        yield _END + "\n"


def _first_bad_utf8(path: Path) -> tuple[int, str]:
    """The 1-based line of the first byte that is not UTF-8, and what it is (the text reader's
    error gives a position inside its read-ahead buffer, not a line)."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return number, f"byte 0x{raw[err.start]:02x} at byte {err.start + 1} of the line"
    return 1, "a truncated UTF-8 sequence"


def read_csv_pairs(
    path: str | Path,
    *,
    img_key: str = "filepath",
    caption_key: str = "title",
    separator: str = "\t",
    multiline: bool = False,
) -> list[CsvPair]:
    """Read the ``(image path, caption)`` rows of a CSV / TSV file.

    Args:
        path: The file.
        img_key: The column of image paths.
        caption_key: The column of captions.
        separator: The field separator (one character).
        multiline: Whether fields may hold line breaks (``data.csv_multiline``; module
            docstring).

    Returns:
        The rows in file order.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: No header with both columns, a short row, an empty image path or
            caption, a field holding line breaks without ``multiline``, a quote never closed,
            a byte that is not UTF-8 (each naming the line), or no row at all.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected a CSV/TSV of image paths and captions")
    if len(separator) != 1:
        raise ValueError(f"separator must be one character, got {separator!r}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:  # -sig: a spreadsheet's BOM
            reading = _CsvReading(path, fh, separator=separator, multiline=multiline)
            try:
                return reading.pairs(img_key, caption_key)
            except csv.Error as err:
                hint = ""
                if "field larger than field limit" in str(err):
                    hint = "; a quote opened on this line and never closed?"
                raise DataFormatError(
                    path, f"unreadable row ({err}){hint}; {reading.so_far()}", line=reading.start
                ) from None
    except UnicodeDecodeError:
        number, what = _first_bad_utf8(path)
        raise DataFormatError(path, f"not UTF-8: {what}; save it as UTF-8", line=number) from None


class _CsvReading:
    """One pass of :func:`read_csv_pairs` over an open file: the rows so far and the line the
    current one starts on, which its errors name."""

    def __init__(self, path: Path, fh: Any, *, separator: str, multiline: bool) -> None:
        self.path, self.separator, self.multiline = path, separator, multiline
        self.lines = _LinesThenEnd(fh)
        self.reader = csv.reader(self.lines, delimiter=separator)
        self.rows: list[CsvPair] = []
        self.header: list[str] = []
        self.start = 1

    def _next(self) -> list[str] | None:
        """The next record (``[]`` for a blank line), None at the end of the file."""
        self.start = self.reader.line_num + 1
        fields = next(self.reader, None)
        if fields is None or fields == [_END]:
            return None
        self._check(fields)
        return fields

    def pairs(self, img_key: str, caption_key: str) -> list[CsvPair]:
        path = self.path
        header = self._next()
        if header is None:
            raise DataFormatError(path, "is empty; expected a header row and pairs")
        self.header = header
        for key, what in ((img_key, "csv_img_key"), (caption_key, "csv_caption_key")):
            if key not in header:
                raise DataFormatError(
                    path,
                    f"header has no column {key!r} (data.{what}); columns: "
                    f"{', '.join(repr(h) for h in header)} (separator {self.separator!r})",
                    line=1,
                )
        i_img, i_cap = header.index(img_key), header.index(caption_key)
        while (fields := self._next()) is not None:
            if not fields:
                continue
            if len(fields) <= max(i_img, i_cap):
                raise DataFormatError(
                    path, f"{len(fields)} fields; expected {len(header)}", line=self.start
                )
            image, caption = fields[i_img].strip(), fields[i_cap].strip()
            if not image or not caption:
                empty = img_key if not image else caption_key
                raise DataFormatError(path, f"empty {empty!r}", line=self.start)
            self.rows.append(CsvPair(image, caption, self.start, self.reader.line_num))
        if not self.rows:
            raise DataFormatError(path, "has a header but no pairs")
        return self.rows

    def so_far(self) -> str:
        """The rows read before a refused one, against the file's lines."""
        rows, lines = self.rows, self.lines
        before = (
            f"{len(rows)} rows read before it (lines {rows[0].line}-{rows[-1].end_line})"
            if rows
            else "no row read before it"
        )
        if lines.done:
            return f"{before} of the file's {lines.count} lines"
        return f"{before}; {lines.count} lines read so far"

    def _check(self, fields: list[str]) -> None:
        """Refuse a record whose field ran to the end of the file (a quote never closed) or,
        without ``multiline``, holds a line break."""
        start, end = self.start, self.reader.line_num
        for k, field in enumerate(fields):
            name = repr(self.header[k]) if k < len(self.header) else f"#{k + 1}"
            if _END in field:
                swallowed = self.lines.count - start
                tail = f", swallowing its last {swallowed} lines" if swallowed else ""
                raise DataFormatError(
                    self.path,
                    f"a quote opened in field {name} is never closed: the field runs to the "
                    f"end of the file{tail}; {self.so_far()}",
                    line=start,
                )
            if not self.multiline and ("\n" in field or "\r" in field):
                sep = self.separator
                holds = f" and {field.count(sep)} separators" if sep in field else ""
                breaks = "1 line break" if end - start == 1 else f"{end - start} line breaks"
                raise DataFormatError(
                    self.path,
                    f"field {name} runs over lines {start}-{end}, holding {breaks}{holds}: "
                    f"a quote not closed where it should be? Fields that hold "
                    f"line breaks need data.csv_multiline = true; {self.so_far()}",
                    line=start,
                )


class CsvPairsDataset(SkipsBadImages):
    """The pairs of a CSV / TSV file as a :class:`~vlret.data.dataset.RetrievalDataset` (module
    docstring); bad images are skipped as :class:`~vlret.data.bad_samples.SkipsBadImages` says.

    ``image(i)`` is ``image_transform(pil_image)`` or the RGB PIL image without a transform
    (read by :func:`vlret._images.open_rgb` under ``max_image_pixels``); ``image_ids`` are the
    paths as written in the file.

    Args:
        path: The CSV / TSV file.
        img_key: The column of image paths.
        caption_key: The column of captions.
        separator: The field separator.
        image_root: The folder relative image paths start from (default: the file's folder).
        image_transform: Maps an RGB PIL image to the model's input.
        encoder: Turns caption strings into token ids.
        multiline: Whether fields may hold line breaks (``data.csv_multiline``).
        max_image_pixels: The pixel cap (``data.max_image_pixels``; None: none).
        skip_bad: Training: serve the next readable row in place of a row whose image is bad
            and count it in the batch's ``skipped`` (:meth:`skip_bad_images`; otherwise
            reading it raises the one-line :class:`~vlret._images.ImageReadError`).
        max_bad_fraction: ``data.max_bad_fraction``, the epoch's share of bad rows that stops
            a run (:func:`vlret.data.bad_samples.check_bad_fraction`).
        key: The config key of the file, named in errors (``data.csv``, ``data.dev_csv``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        img_key: str = "filepath",
        caption_key: str = "title",
        separator: str = "\t",
        image_root: str | Path | None = None,
        image_transform: Callable[[Any], Any] | None = None,
        encoder: CaptionEncoder | None = None,
        multiline: bool = False,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        skip_bad: bool = False,
        max_bad_fraction: float = 0.01,
        key: str = "data.csv",
    ) -> None:
        self.path = Path(path)
        self.rows = read_csv_pairs(
            self.path,
            img_key=img_key,
            caption_key=caption_key,
            separator=separator,
            multiline=multiline,
        )
        self.image_root = Path(image_root) if image_root is not None else self.path.parent
        self.image_transform = image_transform
        self.encoder = encoder
        self.max_image_pixels = max_image_pixels
        self.max_bad_fraction, self.bad_key = max_bad_fraction, key
        if skip_bad:
            self.skip_bad_images(key=key, max_bad_fraction=max_bad_fraction)
        #: Images a dev set left out (:meth:`keep_readable`).
        self.skipped = 0
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

    @property
    def bad_listing(self) -> Path:
        """The CSV file."""
        return self.path

    @property
    def source_summary(self) -> str:
        """The rows read against the file: ``240 rows (lines 2-241) of train.csv``."""
        first, last = self.rows[0].line, self.rows[-1].end_line
        return f"{len(self.rows)} rows (lines {first}-{last}) of {self.path.name}"

    def image_path(self, index: int) -> Path:
        """The file of image ``index``."""
        return self.image_root / self.image_ids[index]

    def image_source(self, index: int) -> Any:
        """Image ``index`` read as an RGB PIL image.

        Raises:
            FileNotFoundError: The file is missing (without ``skip_bad``).
            ImageReadError: It is not an image, is corrupt or is over the pixel cap (naming
                the CSV's line).
        """
        path = self.image_path(index)
        line = self._first_line[self.image_ids[index]]
        if not self.counts_skipped and not path.is_file():
            raise FileNotFoundError(
                f"{path}: missing; expected the image of line {line} of {self.path}"
            )
        name = f"{self.path.name} line {line}: {path}"
        return open_rgb(path, max_pixels=self.max_image_pixels, name=name)

    def image(self, index: int) -> Any:
        """Image ``index`` as ``image_transform(image)``, or the RGB PIL image without one."""
        image = self.image_source(index)
        return self.image_transform(image) if self.image_transform is not None else image

    def keep_readable(self, *, max_images: int | None, max_bad_fraction: float) -> None:
        """Keep the first ``max_images`` images that read (all: None) with their captions,
        leaving out the ones that do not (read once each, here) and counting them in
        ``skipped``: a dev set's images then never fail during validation.

        Raises:
            FileNotFoundError: An image file is missing.
            TooManyBadSamples: More than ``max_bad_fraction`` of the images read were bad.
            DataFormatError: No image reads.
        """
        kept: list[int] = []
        for img in range(self.num_images):
            if max_images is not None and len(kept) >= max_images:
                break
            try:
                self.image_source(img)
            except ImageReadError:
                self.skipped += 1
                continue
            kept.append(img)
        if not kept:
            raise DataFormatError(
                self.path, f"none of its {self.num_images} images can be read ({self.bad_causes})"
            )
        check_dev_fraction(
            self.skipped,
            len(kept),
            key=self.bad_key,
            max_bad_fraction=max_bad_fraction,
            causes=self.bad_causes,
        )
        new = {old: k for k, old in enumerate(kept)}
        rows = [c for c, img in enumerate(self.txt_to_img.tolist()) if img in new]
        self.captions = [self.captions[c] for c in rows]
        self.rows = [self.rows[c] for c in rows]
        self.txt_to_img = torch.tensor(
            [new[int(self.txt_to_img[c])] for c in rows], dtype=torch.long
        )
        self.image_ids = [self.image_ids[img] for img in kept]

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
                f"image file {self.image_root / first} is missing or not a regular file; "
                f"{len(missing)} of the {len(ids)} image files it names are",
                line=self._first_line[first],
            )


def build_csv_dataset(
    data: Any,
    split: str,
    encoder: Any,
    *,
    image_transform: Any = None,
) -> CsvPairsDataset:
    """The ``train`` (``data.csv``; bad images skipped and counted) or ``dev``
    (``data.dev_csv``, its first ``data.dev_max_images`` images that read,
    :meth:`CsvPairsDataset.keep_readable`) set of a ``[data]`` section with ``format = "csv"``;
    a relative file is relative to the current folder, as every path (:mod:`vlret.data.paths`).

    Raises:
        ValueError: ``split`` is neither, or its file is not configured.
        FileNotFoundError: Its file is missing (naming the key, and the file under
            ``data.root`` where a config of the old rule meant it).
    """
    if split not in ("train", "dev"):
        raise ValueError(f"format 'csv' has the splits 'train' (data.csv) and 'dev', got {split!r}")
    key = "data.csv" if split == "train" else "data.dev_csv"
    name = data.csv if split == "train" else data.dev_csv
    if name is None:
        raise ValueError(f"format 'csv' needs {key}")
    if not Path(name).exists():
        hint = relative_path_hint(name, data_root=data.root)
        raise FileNotFoundError(
            f"{key}: {name}: missing; expected a CSV/TSV of image paths and captions{hint}"
        )
    ds = CsvPairsDataset(
        name,
        img_key=data.csv_img_key,
        caption_key=data.csv_caption_key,
        separator=data.csv_separator,
        image_root=data.image_root,
        image_transform=image_transform,
        encoder=encoder,
        multiline=data.csv_multiline,
        max_image_pixels=data.max_image_pixels,
        skip_bad=split == "train",
        max_bad_fraction=data.max_bad_fraction,
        key=key,
    )
    if split == "dev":  # model selection on the first images that read
        ds.keep_readable(max_images=data.dev_max_images, max_bad_fraction=data.max_bad_fraction)
    return ds


def _open(data: Any, split: str, request: OpenRequest) -> CsvPairsDataset:
    return build_csv_dataset(data, split, request.encoder, image_transform=request.image_transform)


def _dev_split(data: Any) -> str | None:
    return "dev" if data.dev_csv else None


#: A CSV / TSV of image paths and captions, open_clip's (``data.format = "csv"``).
CSV = register_format(
    DataFormat(
        name="csv",
        summary="a CSV / TSV of image paths and captions (open_clip's csv dataset)",
        reader=__name__,
        open=_open,
        splits=("train", "dev"),
        inputs="pixels",
        evaluated_as="karpathy",
        needs={"csv": "(a CSV/TSV of image paths and captions)"},
        owns=("csv", "dev_csv"),
        dev_split=_dev_split,
    )
)


__all__ = [
    "CSV",
    "CsvPair",
    "CsvPairsDataset",
    "build_csv_dataset",
    "read_csv_pairs",
]
