"""Karpathy split JSON (``dataset_coco.json``, ``dataset_flickr30k.json``), parsed and checked.

Top level ``{"images": [...], "dataset": "coco" | "flickr30k" | "flickr8k"}``. Each image has
``filename``, ``imgid``, ``split`` (``train``/``restval``/``val``/``test``), ``sentids`` and
``sentences[]`` (``raw`` with case and punctuation, ``tokens`` lower-cased without
punctuation); COCO images also have ``filepath`` (``train2014``/``val2014``) and ``cocoid``.
An error names the JSON line of the bad entry (:func:`locate_json_line`, shared with the other
JSON formats). The split as a dataset is :mod:`vlret.data.formats.karpathy`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import DataFormatError, read_json

KARPATHY_SPLITS = ("train", "restval", "val", "test")
#: Our split name -> the Karpathy splits it holds (``train`` includes restval by default).
SPLIT_MEMBERS = {
    "train": ("train", "restval"),
    "dev": ("val",),
    "val": ("val",),
    "test": ("test",),
    "testall": ("test",),
}
_LAYOUT = (
    '{"images": [{"filename", "imgid", "split", "sentids", "sentences": '
    '[{"raw", "tokens"}], ("filepath", "cocoid" for COCO)}], "dataset"}'
)
_EXPECTED = "expected " + _LAYOUT

#: A step into a JSON document: an object key or an array index.
JsonPath = Sequence[str | int]

_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _json_offset(text: str, at: JsonPath) -> int:
    """Character offset of the value at ``at`` in the JSON ``text`` (``ValueError`` if absent).

    Walks only the containers on the way, skipping the siblings before the target with
    ``json.JSONDecoder.raw_decode`` (C speed); a repeated key resolves to its last occurrence,
    as ``json.loads`` does.
    """
    decode = json.JSONDecoder().raw_decode

    def skip(i: int) -> int:
        match = _WHITESPACE.match(text, i)
        assert match is not None  # the pattern matches the empty string
        return match.end()

    i = skip(0)
    for step in at:
        if isinstance(step, int):
            if text[i] != "[":
                raise ValueError("not an array")
            i = skip(i + 1)
            for _ in range(step):
                _, i = decode(text, i)
                i = skip(i)
                if text[i] != ",":
                    raise ValueError("index out of range")
                i = skip(i + 1)
            if text[i] == "]":
                raise ValueError("index out of range")
        else:
            if text[i] != "{":
                raise ValueError("not an object")
            i = skip(i + 1)
            found = None
            while text[i] != "}":
                key, i = decode(text, i)
                i = skip(i)
                if text[i] != ":":
                    raise ValueError("malformed object")
                i = skip(i + 1)
                if key == step:
                    found = i
                _, i = decode(text, i)
                i = skip(i)
                if text[i] == ",":
                    i = skip(i + 1)
            if found is None:
                raise ValueError("key not found")
            i = found
    return i


def locate_json_line(path: str | Path, at: JsonPath) -> int | None:
    """Line where a value of a JSON file starts, for an error message.

    Reads the file again: meant for error messages, after ``json.loads`` succeeded.

    Args:
        path: The JSON file.
        at: The value's JSON path, e.g. ``("images", 3, "imgid")``.

    Returns:
        The 1-based line, or None when it cannot be found (the caller then names the entry
        only).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
        return text.count("\n", 0, _json_offset(text, at)) + 1
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return None


class EntryError(Exception):
    """A malformed entry of a parsed JSON document.

    The reader turns it into a :class:`DataFormatError` with the file and the line
    (:meth:`located`).

    Args:
        at: The entry's JSON path.
        message: What is wrong with it.
    """

    def __init__(self, at: JsonPath, message: str) -> None:
        super().__init__(message)
        self.at = tuple(at)
        self.message = message

    def located(self, path: Path) -> DataFormatError:
        """The error as a :class:`DataFormatError` naming ``path`` and the entry's line."""
        return DataFormatError(path, self.message, line=locate_json_line(path, self.at))


@dataclass(frozen=True)
class KarpathySentence:
    """One caption: its ``sentid``, ``raw`` text and lower-cased ``tokens``."""

    sentid: int
    raw: str
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class KarpathyImage:
    """One image entry of a Karpathy JSON (``filepath`` and ``cocoid`` for COCO only)."""

    imgid: int
    filename: str
    split: str
    sentids: tuple[int, ...]
    sentences: tuple[KarpathySentence, ...]
    filepath: str | None = None
    cocoid: int | None = None

    def path(self, image_root: str | Path) -> Path:
        """The image file: ``image_root/filepath/filename`` (COCO) or ``image_root/filename``."""
        root = Path(image_root)
        return root / self.filepath / self.filename if self.filepath else root / self.filename


@dataclass(frozen=True)
class KarpathyData:
    """A parsed Karpathy JSON: the file, its ``dataset`` name and its images in file order."""

    path: Path
    dataset: str
    images: tuple[KarpathyImage, ...]

    def split(self, name: str, *, include_restval: bool = True) -> list[KarpathyImage]:
        """The images of one of our splits, in file order.

        Args:
            name: ``"train"``, ``"dev"``, ``"test"`` or ``"testall"`` (see the module
                docstring).
            include_restval: Whether ``"train"`` includes Karpathy's restval images.

        Returns:
            The split's images.

        Raises:
            ValueError: An unknown split name.
        """
        members = self.split_members(name, include_restval=include_restval)
        return [im for im in self.images if im.split in members]

    @staticmethod
    def split_members(name: str, *, include_restval: bool = True) -> tuple[str, ...]:
        """The Karpathy splits that our split ``name`` holds (arguments as :meth:`split`)."""
        if name not in SPLIT_MEMBERS:
            raise ValueError(f"split must be one of {tuple(SPLIT_MEMBERS)}, got {name!r}")
        return tuple(s for s in SPLIT_MEMBERS[name] if include_restval or s != "restval")

    def line_of(self, image: KarpathyImage) -> int | None:
        """Line of ``image``'s entry in the JSON file (for an error message), if found."""
        k = next(k for k, im in enumerate(self.images) if im is image)
        return locate_json_line(self.path, ("images", k))


def _field(entry: dict, key: str, kind: type | tuple, where: str, at: tuple) -> Any:
    """``entry[key]`` of type ``kind``; an :class:`EntryError` at the entry (missing key) or at
    the value (wrong type) otherwise."""
    if key not in entry:
        raise EntryError(at, f"{where} has no {key!r}; {_EXPECTED}")
    value = entry[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise EntryError(
            (*at, key), f"{where}: {key!r} is {type(value).__name__} {value!r:.60}; {_EXPECTED}"
        )
    return value


def _parse_image(k: int, entry: Any, is_coco: bool) -> KarpathyImage:
    where = f"images[{k}]"
    at = ("images", k)
    if not isinstance(entry, dict):
        raise EntryError(at, f"{where} is {type(entry).__name__}; {_EXPECTED}")
    imgid = _field(entry, "imgid", int, where, at)
    where = f"images[{k}] (imgid {imgid})"
    filename = _field(entry, "filename", str, where, at)
    split = _field(entry, "split", str, where, at)
    if split not in KARPATHY_SPLITS:
        raise EntryError(
            (*at, "split"), f"{where}: split {split!r}; expected one of {KARPATHY_SPLITS}"
        )
    sentids = _field(entry, "sentids", list, where, at)
    raw_sentences = _field(entry, "sentences", list, where, at)
    if len(sentids) != len(raw_sentences):
        raise EntryError(
            at,
            f"{where} has {len(sentids)} sentids and {len(raw_sentences)} sentences; "
            "expected one sentid per sentence",
        )
    sentences = []
    for s, (sid, sent) in enumerate(zip(sentids, raw_sentences, strict=True)):
        swhere = f"{where}.sentences[{s}]"
        sat = (*at, "sentences", s)
        if not isinstance(sent, dict):
            raise EntryError(sat, f"{swhere} is {type(sent).__name__}; {_EXPECTED}")
        raw = _field(sent, "raw", str, swhere, sat)
        tokens = _field(sent, "tokens", list, swhere, sat)
        if not isinstance(sid, int) or sent.get("sentid", sid) != sid:
            raise EntryError(
                sat, f"{swhere}: sentid {sent.get('sentid')!r} but sentids[{s}] is {sid!r}"
            )
        sentences.append(KarpathySentence(sid, raw, tuple(str(t) for t in tokens)))
    filepath = cocoid = None
    if is_coco:
        filepath = _field(entry, "filepath", str, where, at)
        cocoid = _field(entry, "cocoid", int, where, at)
    return KarpathyImage(
        imgid=imgid,
        filename=filename,
        split=split,
        sentids=tuple(sentids),
        sentences=tuple(sentences),
        filepath=filepath,
        cocoid=cocoid,
    )


def read_karpathy_json(path: str | Path) -> KarpathyData:
    """Parse and validate a Karpathy split JSON.

    Errors name the file, the entry (``images[3] (imgid 3) has no 'split'``) and, where the
    entry can be found in the text, its line (the line of the offending value, or of the
    entry's opening brace for a missing key).

    Args:
        path: The JSON file.

    Returns:
        The parsed file.

    Raises:
        DataFormatError: The file is unreadable or an entry is malformed.
    """
    path = Path(path)
    data = read_json(path, "a Karpathy split JSON " + _LAYOUT)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataFormatError(path, f"top level has no 'images' list; {_EXPECTED}")
    images = data["images"]
    dataset = data.get("dataset")
    if dataset is None:  # infer: only COCO entries carry a filepath
        dataset = (
            "coco" if images and isinstance(images[0], dict) and "filepath" in images[0] else ""
        )
    if not isinstance(dataset, str):
        raise DataFormatError(
            path,
            f"'dataset' is {dataset!r}; expected a name such as 'coco'",
            line=locate_json_line(path, ("dataset",)),
        )
    is_coco = dataset == "coco"
    try:
        parsed = tuple(_parse_image(k, entry, is_coco) for k, entry in enumerate(images))
    except EntryError as err:
        raise err.located(path) from None
    return KarpathyData(path, dataset, parsed)


__all__ = [
    "KARPATHY_SPLITS",
    "SPLIT_MEMBERS",
    "EntryError",
    "JsonPath",
    "KarpathyData",
    "KarpathyImage",
    "KarpathySentence",
    "locate_json_line",
    "read_karpathy_json",
]
