"""Karpathy split JSON (``dataset_coco.json``, ``dataset_flickr30k.json``) plus an image folder.

Top level ``{"images": [...], "dataset": "coco" | "flickr30k" | "flickr8k"}``. Each image has
``filename``, ``imgid``, ``split`` (``train``/``restval``/``val``/``test``), ``sentids`` and
``sentences[]`` (``raw`` with case and punctuation, ``tokens`` lower-cased without
punctuation); COCO images also have ``filepath`` (``train2014``/``val2014``) and ``cocoid``.
The image file is ``image_root/filepath/filename`` (COCO) or ``image_root/filename``.

Our splits: ``train`` = Karpathy train + restval (COCO's 113,287 images; F30K's 29,000),
``dev`` = val, ``test`` = test (COCO's 5000 images are the precomputed ``testall``, so
``testall`` is accepted as another name for it). COCO images with 6 or 7 captions keep their
first ``captions_per_image`` (5).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..bad_samples import SkipsBadImages
from ..captioning_files import read_captions_file
from ..checks import SCAN_CHUNK_BYTES, DataFormatError, check_in_dim, read_json
from ..dataset import CaptionEncoder
from ..vocab import DEFAULT_MIN_COUNT, Vocabulary, build_vocab

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


__all__ = [
    "KARPATHY_SPLITS",
    "KarpathyData",
    "KarpathyDataset",
    "KarpathyImage",
    "KarpathySentence",
    "build_karpathy_vocab",
    "karpathy_vocab_captions",
    "read_karpathy_json",
]
