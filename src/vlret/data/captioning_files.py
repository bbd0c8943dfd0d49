"""The captions file: captions for one split of a dataset, read in place of its annotations.

A captions file is plain UTF-8 text, one caption per line (every line ends with ``\\n``; an
empty line is an empty caption, which a captioner may produce), the ``k`` captions of an image
on consecutive lines, ``k`` the same for every image, images in the image order of the split
(precomputed features: the rows of ``{split}_ims.npy``; Karpathy: the split's images in
``dataset_*.json`` order). Its sidecar ``FILE.json`` says what the lines are::

    {"split": "train", "images": 29000, "captions_per_image": 1,
     "source": "blip:/models/blip-base", ...generation settings...}

``vlret caption`` (:mod:`vlret.captioning.generate`) and ``vlret synth --pseudo-captions``
(:mod:`vlret.worlds.terse`) write them; ``data.train_captions`` (and
``data.dev_captions``, ``data.test_captions``) make a split read its captions from one, with
the file's own ``k`` (docs/captions.md).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import atomic_write_text
from .checks import DataFormatError

#: The sidecar's format version key.
FORMAT_KEY = "vlret_captions"
#: Split names that denote the same images (Karpathy's ``val`` is our ``dev``; ``testall``
#: is COCO's 5000-image test of the Karpathy format).
_SAME_SPLIT = {"val": "dev", "testall": "test"}


def sidecar_path(path: str | Path) -> Path:
    """The sidecar of captions file ``path``: ``path`` with ``.json`` appended."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def clean_caption(text: str) -> str:
    """One line of a captions file from a generated text: line breaks and tabs become spaces,
    runs of spaces one, ends stripped."""
    return " ".join(text.replace("\r", " ").replace("\n", " ").replace("\t", " ").split())


@dataclass(frozen=True)
class CaptionsFile:
    """A captions file read and checked against its split (:func:`read_captions_file`).

    Attributes:
        path: The file.
        captions: One per line, ``captions_per_image`` consecutive ones per image.
        captions_per_image: The file's ``k``.
        meta: The sidecar (empty without one).
    """

    path: Path
    captions: list[str]
    captions_per_image: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_images(self) -> int:
        """Images the file covers."""
        return len(self.captions) // self.captions_per_image


def _read_text_lines(path: Path, label: str) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing; expected the captions file {label} names (one caption per line)"
        )
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataFormatError(path, f"not UTF-8 ({label})", line=line) from None
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":  # the final line's newline
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _read_sidecar(path: Path) -> dict[str, Any]:
    side = sidecar_path(path)
    if not side.is_file():
        return {}
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataFormatError(side, f"not a JSON sidecar of {path.name} ({err})") from None
    if not isinstance(meta, dict):
        raise DataFormatError(side, f"expected a JSON object, got {type(meta).__name__}")
    return meta


def _sidecar_int(meta: dict[str, Any], key: str, side: Path) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataFormatError(side, f"{key!r} is {value!r}; expected a non-negative integer")
    return value


def read_captions_file(
    path: str | Path,
    *,
    num_images: int,
    split: str | None = None,
    key: str = "captions file",
) -> CaptionsFile:
    """Read a captions file for a split of ``num_images`` images.

    Its ``k`` is the sidecar's ``captions_per_image``; without a sidecar (or that key), the
    line count over the image count when it divides exactly.

    Args:
        path: The file.
        num_images: Images of the split it replaces the captions of.
        split: The split's name; a sidecar naming another split is refused (``val`` and
            ``dev``, ``test`` and ``testall`` are the same).
        key: What names the file (``"data.train_captions"``), in error messages.

    Returns:
        The captions and their ``k``.

    Raises:
        FileNotFoundError: The file is missing (the message names ``key``).
        DataFormatError: The line count does not match the images (the message names the
            file, its line count and the image count), or the sidecar disagrees with the
            split.
    """
    path = Path(path)
    lines = _read_text_lines(path, key)
    meta = _read_sidecar(path)
    side = sidecar_path(path)
    n = len(lines)
    k = _sidecar_int(meta, "captions_per_image", side)
    images = _sidecar_int(meta, "images", side)
    named = meta.get("split")
    if split is not None and isinstance(named, str):
        if _SAME_SPLIT.get(named, named) != _SAME_SPLIT.get(split, split):
            raise DataFormatError(
                side, f"describes split {named!r}; {key} is read for split {split!r}"
            )
    if images is not None and images != num_images:
        raise DataFormatError(
            side, f"says {images} images; {key} is read for a split of {num_images} images"
        )
    if k is None:
        if num_images < 1 or n == 0 or n % num_images:
            raise DataFormatError(
                path,
                f"{key}: {n} lines for {num_images} images, which does not divide into the same "
                "number of captions per image (and no sidecar gives captions_per_image)",
            )
        k = n // num_images
    if k < 1 or n != k * num_images:
        raise DataFormatError(
            path,
            f"{key}: {n} lines for {num_images} images; expected {k * num_images} "
            f"({k} per image, as {side.name if meta else 'the line count'} says)",
        )
    return CaptionsFile(path, lines, k, meta)


def write_captions_file(
    path: str | Path,
    captions: Sequence[str],
    *,
    split: str,
    captions_per_image: int,
    source: str,
    **meta: Any,
) -> Path:
    """Write a captions file and its sidecar, each atomically (the sidecar first, so a file
    never stands without the sidecar that describes it).

    Args:
        path: The captions file.
        captions: ``captions_per_image`` consecutive captions per image, in split order (each
            on one line: no line breaks).
        split: The split they describe.
        captions_per_image: Captions per image.
        source: What made them (``"blip:/models/blip"``, ``"synthetic-terse"``).
        **meta: More sidecar entries (the generation settings).

    Returns:
        ``path``.

    Raises:
        ValueError: A caption holds a line break, or the count is no multiple of
            ``captions_per_image``.
    """
    if captions_per_image < 1 or len(captions) % captions_per_image:
        raise ValueError(
            f"{len(captions)} captions do not divide into {captions_per_image} per image"
        )
    for j, text in enumerate(captions):
        if "\n" in text or "\r" in text:
            raise ValueError(f"caption {j} holds a line break: {text!r:.80}")
    record = {
        FORMAT_KEY: 1,
        "split": split,
        "images": len(captions) // captions_per_image,
        "captions_per_image": captions_per_image,
        "source": source,
        **meta,
    }
    atomic_write_text(sidecar_path(path), json.dumps(record, indent=1) + "\n")
    return atomic_write_text(path, "".join(f"{text}\n" for text in captions))


def captions_file_key(data: Any, split: str) -> str:
    """The ``[data]`` key of the captions file that split ``split`` reads (it may be unset),
    for a run's data config ``data``: ``train_captions`` for ``data.train_split``,
    ``dev_captions`` for ``data.dev_split``, ``test_captions`` for any other split."""
    if split == data.train_split:
        return "train_captions"
    if data.dev_split is not None and split == data.dev_split:
        return "dev_captions"
    return "test_captions"


def split_captions_args(data: Any, split: str) -> dict[str, Any]:
    """The dataset arguments (``captions_file``, ``captions_key``) that make split ``split``
    read its captions file, when the run's data config ``data`` sets one; else none."""
    name = captions_file_key(data, split)
    path = getattr(data, name)
    return {} if path is None else {"captions_file": path, "captions_key": f"data.{name}"}


def captions_vocab_splits(data: Any) -> list[str]:
    """The splits a run with ``data.train_captions`` builds its vocabulary from: the training
    split, and the dev split when ``data.dev_captions`` is set. Their captions files only, not
    the dev annotations: in the weakly-supervised setting (AdaCL 3.4) the model sees no human
    caption, and a word it never trained on is ``<unk>`` rather than an untrained embedding
    (``data.vocab`` gives any other vocabulary)."""
    dev = data.dev_split if data.dev_captions is not None else None
    return [data.train_split, *([dev] if dev is not None else [])]


__all__ = [
    "FORMAT_KEY",
    "CaptionsFile",
    "captions_file_key",
    "captions_vocab_splits",
    "clean_caption",
    "read_captions_file",
    "sidecar_path",
    "split_captions_args",
    "write_captions_file",
]
