"""The annotation files of the three text-based person-search data sets, parsed and checked.

All three are one JSON list of records, one record per image:

* CUHK-PEDES ``reid_raw.json``: ``{"split", "captions": [..], "file_path",
  "processed_tokens", "id"}``; splits ``train`` / ``val`` / ``test``; ids start at 1;
  images under ``imgs/`` (``file_path`` like ``CUHK01/0363004.png``).
* ICFG-PEDES ``ICFG-PEDES.json`` (its documentation also writes ``ICFG_PEDES.json``): the same
  schema, splits ``train`` / ``test`` only: it has **no validation split**. Its ``imgs/train``
  and ``imgs/test`` folders are MSMT17's and are not the split: the ``split`` field is.
* RSTPReid ``data_captions.json``: ``{"id", "img_path", "captions", "split"}``; splits
  ``train`` / ``val`` / ``test``.

The ``split`` field is the official split. A caption's person is its record's ``id`` (the raw
id, kept for evaluation); training relabels the identities of a split to ``0..N-1`` in the
order of their raw ids (:meth:`PedesData.identity_labels`), which is IRRA's ``id - 1`` on
CUHK-PEDES and its raw id on RSTPReid.

Two records with the same image file are one image when they agree on the person and the
split (their captions are joined, in file order); they are an error otherwise. Every error
names the file, the record (its index and key) and, where it can be found, the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...checks import DataFormatError, read_json
from ..karpathy_json import locate_json_line

#: ``data.format`` names of the person-search data sets (also their protocol names).
PEDES_FORMATS = ("cuhk-pedes", "icfg-pedes", "rstpreid")


@dataclass(frozen=True)
class PedesLayout:
    """What differs between the three annotation files.

    Attributes:
        title: The data set's name in messages.
        files: The annotation file names, the standard one first.
        path_key: The record key of the image file (relative to the image folder).
        splits: The values of the ``split`` field.
        keys: The keys of a released record (for the expected-layout message).
    """

    title: str
    files: tuple[str, ...]
    path_key: str
    splits: tuple[str, ...]
    keys: tuple[str, ...]

    def expected(self) -> str:
        """The released schema, for error messages."""
        return f"expected a list of {{{', '.join(repr(k) for k in self.keys)}}} records"


LAYOUTS = {
    "cuhk-pedes": PedesLayout(
        "CUHK-PEDES",
        ("reid_raw.json",),
        "file_path",
        ("train", "val", "test"),
        ("split", "captions", "file_path", "processed_tokens", "id"),
    ),
    "icfg-pedes": PedesLayout(
        "ICFG-PEDES",
        ("ICFG-PEDES.json", "ICFG_PEDES.json"),
        "file_path",
        ("train", "test"),
        ("split", "captions", "file_path", "processed_tokens", "id"),
    ),
    "rstpreid": PedesLayout(
        "RSTPReid",
        ("data_captions.json",),
        "img_path",
        ("train", "val", "test"),
        ("id", "img_path", "captions", "split"),
    ),
}
#: Our split names -> the ``split`` value they read (``dev`` is the run config's default name
#: of the validation split).
SPLIT_ALIASES = {"train": "train", "val": "val", "dev": "val", "test": "test"}
#: The image folder under the data root (IRRA's ``imgs/``).
IMAGE_FOLDER = "imgs"
#: The range of a person id (the identities are int64 tensors).
PERSON_ID_MIN, PERSON_ID_MAX = -(2**63), 2**63 - 1


def layout_of(format: str) -> PedesLayout:
    """The :class:`PedesLayout` of a format name (:data:`PEDES_FORMATS`)."""
    if format not in LAYOUTS:
        raise ValueError(f"format must be one of {PEDES_FORMATS}, got {format!r}")
    return LAYOUTS[format]


def default_annotations(format: str, root: str | Path) -> Path:
    """The annotation file of ``format`` under the data folder ``root``: its standard name, or
    the first alternative spelling that exists (ICFG-PEDES: ``ICFG_PEDES.json``); the standard
    name when none exists (the reader then says it is missing)."""
    root = Path(root)
    names = layout_of(format).files
    return next((root / n for n in names if (root / n).is_file()), root / names[0])


def split_value(format: str, split: str) -> str:
    """The ``split`` field value our split name reads, refusing what the data set lacks.

    Raises:
        ValueError: An unknown split, or ``val`` / ``dev`` on ICFG-PEDES (it has none; the
            message names the alternatives).
    """
    layout = layout_of(format)
    if split not in SPLIT_ALIASES:
        raise ValueError(f"split must be one of {tuple(SPLIT_ALIASES)}, got {split!r}")
    value = SPLIT_ALIASES[split]
    if value not in layout.splits:
        raise ValueError(
            f"split {split!r}: {layout.title} has no validation split (only "
            f"{' and '.join(layout.splits)}); train without validation (data.dev_split = "
            "null: best.pt is the last epoch) or select on the test split by name "
            '(data.dev_split = "test")'
        )
    return value


@dataclass(frozen=True)
class PedesImage:
    """One image of an annotation file (records sharing a file merged).

    Attributes:
        path: The image file, relative to the image folder, as the file writes it.
        person: The raw person id.
        split: The ``split`` value.
        captions: The captions (stripped), in file order.
        record: The index of the (first) record in the file.
        merged: The later records of the same file (and person and split) joined into it, in
            file order; empty for a file named once.
    """

    path: str
    person: int
    split: str
    captions: tuple[str, ...]
    record: int
    merged: tuple[int, ...] = ()


@dataclass(frozen=True)
class PedesData:
    """A parsed annotation file: its path, format and images in file order."""

    path: Path
    format: str
    images: tuple[PedesImage, ...]

    @property
    def layout(self) -> PedesLayout:
        """The format's :class:`PedesLayout`."""
        return layout_of(self.format)

    def split(self, name: str) -> list[PedesImage]:
        """The images of one of our splits (:data:`SPLIT_ALIASES`), in file order.

        Raises:
            ValueError: An unknown split, or one the data set lacks (:func:`split_value`).
            DataFormatError: The file has no record of that split.
        """
        value = split_value(self.format, name)
        images = [im for im in self.images if im.split == value]
        if not images:
            raise DataFormatError(
                self.path, f"has no record with split {value!r}; expected at least one"
            )
        return images

    def line_of(self, record: int, key: str | None = None) -> int | None:
        """Line of record ``record`` (or of its ``key``) in the file, if found."""
        at: tuple[str | int, ...] = (record,) if key is None else (record, key)
        return locate_json_line(self.path, at)

    def error(self, record: int, key: str | None, message: str) -> DataFormatError:
        """A :class:`DataFormatError` naming the file, the record ``record`` (and ``key``)
        and its line."""
        where = f"record {record}" + (f" key {key!r}" if key is not None else "")
        return DataFormatError(self.path, f"{where}: {message}", line=self.line_of(record, key))


def identity_labels(persons: Sequence[int]) -> tuple[list[int], list[int]]:
    """Relabel raw person ids to ``0..N-1`` in the order of the raw ids.

    Args:
        persons: A raw id per item.

    Returns:
        ``(labels, raw)``: the label of each item and the raw id of each label (sorted).
    """
    raw = sorted(set(persons))
    index = {p: k for k, p in enumerate(raw)}
    return [index[p] for p in persons], raw


def _check_record(
    k: int, entry: Any, layout: PedesLayout, path: Path
) -> tuple[str, int, str, list[str]]:
    """``(file, person, split, captions)`` of record ``k``, or an ``_Located`` error."""
    if not isinstance(entry, dict):
        raise _Located(k, None, f"is {type(entry).__name__}; {layout.expected()}")
    for key in ("id", layout.path_key, "split", "captions"):
        if key not in entry:
            what = "a caption without an identity" if key == "id" else "a record"
            raise _Located(k, None, f"{what}: no {key!r}; {layout.expected()}")
    person = entry["id"]
    if isinstance(person, bool) or not isinstance(person, int):
        raise _Located(k, "id", f"is {person!r:.60}; expected the integer person id")
    if not PERSON_ID_MIN <= person <= PERSON_ID_MAX:  # identities are int64 tensors
        raise _Located(
            k,
            "id",
            f"is {person!r:.60}; expected an integer person id in [-2**63, 2**63 - 1] (64 bits)",
        )
    file = entry[layout.path_key]
    if not isinstance(file, str) or not file.strip():
        raise _Located(k, layout.path_key, f"is {file!r:.60}; expected the image file's path")
    split = entry["split"]
    if split not in layout.splits:
        raise _Located(
            k, "split", f"unknown split {split!r:.60}; {layout.title} has {list(layout.splits)}"
        )
    captions = entry["captions"]
    if not isinstance(captions, list) or not captions:
        raise _Located(
            k, "captions", f"is {captions!r:.60}; expected a non-empty list of caption strings"
        )
    texts = []
    for c, text in enumerate(captions):
        if not isinstance(text, str) or not text.strip():
            raise _Located(
                k, "captions", f"caption {c} is {text!r:.60}; expected a non-empty string"
            )
        texts.append(text.strip())
    return file, person, split, texts


class _Located(Exception):
    def __init__(self, record: int, key: str | None, message: str) -> None:
        super().__init__(message)
        self.record, self.key, self.message = record, key, message


def read_pedes_json(path: str | Path, format: str) -> PedesData:
    """Parse and check a person-search annotation file (module docstring).

    Args:
        path: The JSON file.
        format: ``cuhk-pedes``, ``icfg-pedes`` or ``rstpreid``.

    Returns:
        The parsed file.

    Raises:
        ValueError: An unknown format.
        FileNotFoundError: The file is missing.
        DataFormatError: The file is not a list of records (or nested deeper than the parser
            reads), or a record lacks its person (``id``; an integer of at most 64 bits), its
            image, its split or its captions, holds an empty caption or an
            unknown split, or shares its image file with a record of another person or split.
    """
    layout = layout_of(format)
    path = Path(path)
    records = read_json(path, f"the {layout.title} annotation file ({layout.expected()})")
    data = PedesData(path, format, ())
    if not isinstance(records, list):
        raise DataFormatError(path, f"top level is {type(records).__name__}; {layout.expected()}")
    merged: dict[str, dict[str, Any]] = {}
    try:
        for k, entry in enumerate(records):
            file, person, split, texts = _check_record(k, entry, layout, path)
            seen = merged.get(file)
            if seen is None:
                merged[file] = {
                    "person": person,
                    "split": split,
                    "captions": texts,
                    "record": k,
                    "merged": [],
                }
                continue
            if seen["person"] != person or seen["split"] != split:
                raise _Located(
                    k,
                    layout.path_key,
                    f"duplicate image file {file!r} with id {person} in split {split!r}; "
                    f"record {seen['record']} gives it id {seen['person']} in split "
                    f"{seen['split']!r} (one image is one person in one split)",
                )
            seen["captions"] = seen["captions"] + texts
            seen["merged"].append(k)
    except _Located as err:
        raise data.error(err.record, err.key, err.message) from None
    images = tuple(
        PedesImage(
            file, m["person"], m["split"], tuple(m["captions"]), m["record"], tuple(m["merged"])
        )
        for file, m in merged.items()
    )
    return PedesData(path, format, images)


__all__ = [
    "IMAGE_FOLDER",
    "LAYOUTS",
    "PEDES_FORMATS",
    "SPLIT_ALIASES",
    "PedesData",
    "PedesImage",
    "PedesLayout",
    "default_annotations",
    "identity_labels",
    "layout_of",
    "read_pedes_json",
    "split_value",
]
