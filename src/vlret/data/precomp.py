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

import codecs
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

SPLITS = ("train", "dev", "test", "testall")
#: Splits whose captions may build a vocabulary (never a test split).
VOCAB_SPLITS = ("train", "dev")


class DataFormatError(ValueError):
    """A data file that exists but does not hold what its format requires.

    ``path`` is the file, ``line`` the 1-based line of a text file and ``row`` the 0-based row
    of a feature array (each ``None`` where it does not apply, e.g. an array shape); they also
    appear in the message: ``"{path}, line {line}: {message}"``, ``"{path}, row {row}: ..."``.
    """

    def __init__(
        self, path: str | Path, message: str, *, line: int | None = None, row: int | None = None
    ) -> None:
        self.path = Path(path)
        self.line = line
        self.row = row
        where = str(self.path)
        if line is not None:
            where += f", line {line}"
        if row is not None:
            where += f", row {row}"
        super().__init__(f"{where}: {message}")


def require_file(path: Path, what: str) -> Path:
    """``path`` if it is a file, else ``FileNotFoundError`` naming it and what it should hold."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected {what}")
    return path


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file without line endings or a leading byte order mark.

    Blank lines at the end of the file (an editor's final newline, or a few more) add no line;
    a blank line before the last entry is kept, for the caller to refuse with its number.
    """
    data = require_file(path, what).read_bytes().removeprefix(codecs.BOM_UTF8)
    lines = data.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for number, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as err:
            raise DataFormatError(
                path, f"not UTF-8 text ({err.reason}); expected {what}", line=number
            ) from None
    return out


def load_feature_array(path: Path, *, mmap: bool = True) -> np.ndarray:
    """A float ``(N, D)`` or ``(N, R, D)`` feature array, memory-mapped unless ``mmap=False``."""
    require_file(path, "a float32 .npy array of shape (N, D) or (N, regions, D)")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataFormatError(
            path, f"not a readable .npy array ({err}); expected float32 features"
        ) from None
    if not isinstance(arr, np.ndarray):
        raise DataFormatError(path, "holds an .npz archive; expected a single .npy array")
    if arr.ndim not in (2, 3) or 0 in arr.shape:
        expected = "(N, D) vectors or (N, regions, D) features, each size >= 1"
        raise DataFormatError(path, f"has shape {arr.shape}; expected {expected}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise DataFormatError(path, f"has dtype {arr.dtype}; expected float32 features")
    return arr


#: Feature bytes read at once by :func:`find_non_finite` (plus a boolean mask a quarter as big).
SCAN_CHUNK_BYTES = 4 << 20
#: The model config key that must match the last feature dimension.
IN_DIM_KEY = "model.image.in_dim"


def check_in_dim(in_dim: int | None) -> None:
    """``ValueError`` unless ``in_dim`` is ``None`` or a positive int."""
    if in_dim is not None and (
        not isinstance(in_dim, int) or isinstance(in_dim, bool) or in_dim < 1
    ):
        raise ValueError(f"in_dim must be a positive int or None, got {in_dim!r}")


def check_feature_size(path: Path, shape: tuple[int, ...], in_dim: int | None) -> None:
    """``DataFormatError`` unless the last dimension of ``shape`` is ``in_dim`` (``None``: any)."""
    check_in_dim(in_dim)
    if in_dim is not None and shape[-1] != in_dim:
        raise DataFormatError(
            path,
            f"has shape {tuple(shape)}: features of size {shape[-1]}, but the model expects "
            f"{IN_DIM_KEY} = {in_dim}; set {IN_DIM_KEY} = {shape[-1]} or use features of "
            f"size {in_dim}",
        )


@dataclass(frozen=True)
class NonFinite:
    """The first non-finite value found: its ``row``, its ``index`` inside the row (``(region,
    dimension)`` or ``(dimension,)``), the ``value`` and how many of the row's values are bad."""

    row: int
    index: tuple[int, ...]
    value: float
    count: int
    row_size: int

    def describe(self, what: str, axis: str) -> str:
        """``"{what}, {axis} 2, dimension 5: NaN (3 of its 64 values are not finite)"``."""
        names = (axis, "dimension")[-len(self.index) :]
        where = ", ".join(f"{name} {i}" for name, i in zip(names, self.index, strict=True))
        found = "NaN" if np.isnan(self.value) else ("inf" if self.value > 0 else "-inf")
        return (
            f"{what}, {where}: {found} ({self.count} of its {self.row_size} values are not "
            "finite); expected finite features (a corrupt or partly written file?)"
        )


def find_non_finite(
    array: np.ndarray,
    *,
    rows: np.ndarray | None = None,
    stop: int | None = None,
    chunk_bytes: int = SCAN_CHUNK_BYTES,
) -> NonFinite | None:
    """The first row holding NaN or inf among ``rows`` (ascending row indices; default: rows
    ``0 .. stop``), or ``None``. Reads about ``chunk_bytes`` of rows at a time: a memory-mapped
    array is streamed with file reads, so neither the heap nor the mapped pages grow with it."""
    if rows is None:
        rows = np.arange(len(array) if stop is None else min(stop, len(array)))
    step = max(1, chunk_bytes // max(1, array[0].nbytes))
    for start in range(0, len(rows), step):
        numbers = rows[start : start + step]
        chunk = _read_rows(array, numbers)
        if np.isfinite(chunk).all():
            continue
        bad = ~np.isfinite(chunk.reshape(len(chunk), -1))
        r = int(bad.any(axis=1).argmax())
        index = tuple(int(i) for i in np.unravel_index(int(bad[r].argmax()), chunk.shape[1:]))
        return NonFinite(
            row=int(numbers[r]),
            index=index,
            value=float(chunk[r][index]),
            count=int(bad[r].sum()),
            row_size=bad.shape[1],
        )
    return None


def _read_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]`` (ascending), one read per run of consecutive rows; a C-ordered
    ``np.memmap`` is read from its file instead of through the mapping."""
    runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
    parts = []
    for run in runs:
        start, n = int(run[0]), len(run)
        if isinstance(array, np.memmap) and array.filename and array.flags.c_contiguous:
            offset = array.offset + start * array[0].nbytes
            flat = np.fromfile(array.filename, array.dtype, n * array[0].size, offset=offset)
            parts.append(flat.reshape(n, *array.shape[1:]))
        else:
            parts.append(array[start : start + n])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file; a syntax error names the file, the line and what was expected."""
    require_file(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataFormatError(path, f"not UTF-8 ({err.reason}); expected {what}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFormatError(
            path, f"invalid JSON ({err.msg}, column {err.colno}); expected {what}", line=err.lineno
        ) from None


class CaptionEncoder(Protocol):
    """Turns a caption into token ids; ``pad_id`` fills padded batches.

    Implemented by :class:`vlret.data.vocab.Vocabulary` and
    :class:`vlret.data.vocab.HFTokenizer`.
    """

    pad_id: int

    def encode(self, text: str) -> list[int]: ...


class RetrievalItem(NamedTuple):
    """One caption with its image: features (a tensor, or what a Karpathy dataset's image
    transform returns), the caption (ids, or the text without an encoder) and both indices."""

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

    features: torch.Tensor | list[Any]
    captions: torch.Tensor | list[str]
    lengths: torch.Tensor | None
    img_index: torch.Tensor
    cap_index: torch.Tensor

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> RetrievalBatch:
        def move(t):
            return t.to(device, non_blocking=non_blocking) if isinstance(t, torch.Tensor) else t

        return RetrievalBatch(*(move(getattr(self, f)) for f in self.__dataclass_fields__))


def pad_captions(
    captions: Sequence[torch.Tensor], *, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D id tensors into ``(B, max_len)`` (long) and return their ``lengths``."""
    lengths = torch.tensor([len(c) for c in captions], dtype=torch.long)
    width = int(lengths.max()) if len(captions) else 0
    out = torch.full((len(captions), width), pad_id, dtype=torch.long)
    for row, cap in enumerate(captions):
        out[row, : len(cap)] = cap
    return out, lengths


def stack_features(feats: Sequence[Any]) -> torch.Tensor | list[Any]:
    """Stack tensors; anything else (image paths, PIL images) stays a list."""
    return torch.stack(list(feats)) if isinstance(feats[0], torch.Tensor) else list(feats)


def collate_retrieval(items: Sequence[RetrievalItem], *, pad_id: int = 0) -> RetrievalBatch:
    """Stack features, pad captions with ``pad_id`` (keeping the batch order), keep indices."""
    if not items:
        raise ValueError("collate_retrieval needs at least one item")
    feats = stack_features([it[0] for it in items])
    caps = [it[1] for it in items]
    if isinstance(caps[0], str):
        captions, lengths = list(caps), None
    else:
        captions, lengths = pad_captions(caps, pad_id=pad_id)
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
        return len(self.image_ids)

    @property
    def num_captions(self) -> int:
        return len(self.captions)

    def image(self, index: int) -> Any:
        raise NotImplementedError

    def caption(self, index: int) -> torch.Tensor | str:
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
        """Raise :class:`DataFormatError` if the features this dataset serves hold NaN or inf
        (scanned ``chunk_bytes`` at a time) or, with ``in_dim`` (the model's
        ``model.image.in_dim``), have another last dimension. Nothing to check here."""
        check_in_dim(in_dim)


def check_features(
    dataset: RetrievalDataset, *, in_dim: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
) -> None:
    """:meth:`RetrievalDataset.check_features`, before training: the error names the file, the
    first bad row (image or video, region or frame, dimension) and the value found, or the
    shape and ``model.image.in_dim``."""
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
    def collate(items: Sequence[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor]:
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
        index = torch.tensor([it[1] for it in items], dtype=torch.long)
        caps = [it[0] for it in items]
        if caps and isinstance(caps[0], str):
            return caps, None, index
        ids, lengths = pad_captions(caps, pad_id=self.base.pad_id)
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
        if self._array is None:
            self._array = load_feature_array(self.path, mmap=self.mmap)
        return self._array

    def row(self, index: int) -> torch.Tensor:
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
    an image must then agree), per-image when it equals the image count; anything else is an
    error.
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

    ``max_images`` keeps the first images and their captions (model selection on the first
    5000 dev captions uses ``max_images=1000``). ``mmap=False`` loads the features into memory.
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
        """The size check, then a scan of rows ``0 .. num_images`` of ``{split}_ims.npy``."""
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
    """The captions of ``splits`` (validated against their features), for building a vocab."""
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
