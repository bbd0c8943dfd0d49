"""The record every classification reader returns, and the file helpers the readers share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..._extras import require
from ..._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb
from ..checks import DataFormatError

if TYPE_CHECKING:
    from PIL import Image

#: the image files a class folder may hold (torchvision's ``IMG_EXTENSIONS``), any case
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageSource(Protocol):
    """Where a set's images come from: decoded one at a time, on demand."""

    def __len__(self) -> int: ...

    def image(self, i: int) -> Image.Image: ...

    def describe(self, i: int) -> str: ...


@dataclass(frozen=True)
class FileImages:
    """Images stored one per file (every set but CIFAR), decoded under the pixel cap
    ``max_pixels`` (``data.max_image_pixels``'s default unless given)."""

    paths: tuple[Path, ...]
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, i: int) -> Image.Image:
        return open_rgb(self.paths[i], max_pixels=self.max_pixels)

    def describe(self, i: int) -> str:
        return str(self.paths[i])


@dataclass(frozen=True)
class ArrayImages:
    """Images stored as rows of a uint8 ``(N, 3 * H * W)`` array of CHW planes (CIFAR)."""

    path: Path
    data: np.ndarray = field(repr=False)
    height: int = 32
    width: int = 32

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def image(self, i: int) -> Image.Image:
        pil = require("PIL.Image", "reading classification images")
        planes = np.asarray(self.data[i], dtype=np.uint8).reshape(3, self.height, self.width)
        return pil.fromarray(np.ascontiguousarray(planes.transpose(1, 2, 0)), "RGB")

    def describe(self, i: int) -> str:
        return f"{self.path} row {i}"


@dataclass(frozen=True)
class ClassificationSet:
    """One split of an image classification set, as zero-shot evaluation reads it.

    Args:
        name: The set (one of :data:`vlret.data.classification.DATASETS`).
        split: The split read (``"test"``; ImageNet-1k's is ``"val"``).
        root: The folder the set was read from (the release's own top folder).
        classnames: Human-readable class names, index = label, as CLIP prompts need them.
        labels: One label per image.
        source: The images, decoded on demand (:class:`FileImages`, :class:`ArrayImages`).

    Raises:
        ValueError: No image, a label count other than the image count, or a label outside
            ``[0, len(classnames))``.
    """

    name: str
    split: str
    root: Path
    classnames: list[str]
    labels: list[int]
    source: ImageSource = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.source):
            raise ValueError(
                f"{self.name} {self.split}: {len(self.labels)} labels for {len(self.source)} images"
            )
        if not self.labels:
            raise ValueError(f"{self.root}: the {self.name} {self.split} split holds no image")
        bad = next(
            (i for i, y in enumerate(self.labels) if not 0 <= y < len(self.classnames)), None
        )
        if bad is not None:
            raise ValueError(
                f"{self.source.describe(bad)}: label {self.labels[bad]} outside "
                f"[0, {len(self.classnames)}) for the {len(self.classnames)} classes of {self.name}"
            )

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, i: int) -> Image.Image:
        """Image ``i``, decoded as RGB."""
        return self.source.image(i)

    def describe(self, i: int) -> str:
        """Where image ``i`` comes from: its file, or the file and row of an array."""
        return self.source.describe(i)


def find_root(root: Path, tops: Sequence[str], marker: str, layout: str) -> Path:
    """The release's top folder: ``root`` itself or ``root / top`` for the first ``top`` that
    holds ``marker``.

    Raises:
        FileNotFoundError: ``root`` is missing, or no candidate holds ``marker`` (the layout
            expected is named).
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: missing; expected a folder holding {layout}")
    for top in ("", *tops):
        base = root / top if top else root
        if (base / marker).exists():
            return base
    where = " or ".join(str(root / t / marker) if t else str(root / marker) for t in ("", *tops))
    raise FileNotFoundError(f"{root}: no {where}; expected {layout}")


def image_files(folder: Path) -> list[Path]:
    """The image files directly in ``folder`` (:data:`IMAGE_SUFFIXES`), sorted by name."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def check_split(name: str, split: str, splits: Sequence[str]) -> None:
    """Refuse a split the set does not release.

    Raises:
        ValueError: ``split`` is not one of ``splits``.
    """
    if split not in splits:
        raise ValueError(f"split {split!r}: {name} has {', '.join(repr(s) for s in splits)}")


def require_images(paths: Sequence[Path], where: Path, what: str) -> None:
    """Check that every image file a split file lists exists.

    Raises:
        FileNotFoundError: Naming the first missing file and how many are missing.
    """
    missing = [p for p in paths if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"{missing[0]}: missing{more}; {where} lists it as {what}")


def as_labels(values: Any, path: Path, key: str, count: int) -> list[int]:
    """Integer labels from a released array or list, checked against ``count`` classes.

    Raises:
        DataFormatError: Not a 1-d sequence of integers in ``[0, count)``.
    """
    arr = np.asarray(values)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise DataFormatError(
            path, f"{key!r} holds shape {arr.shape}, dtype {arr.dtype}; expected integer labels"
        )
    bad = np.flatnonzero((arr < 0) | (arr >= count))
    if bad.size:
        raise DataFormatError(
            path, f"{key!r}[{int(bad[0])}] = {int(arr[bad[0]])}; expected a label in [0, {count})"
        )
    return [int(v) for v in arr]
