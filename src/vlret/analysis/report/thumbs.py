"""Thumbnails of a split's images for the report, and the region boxes of precomputed features.

Thumbnails: where the data set serves image files or decoded pictures
(:meth:`~vlret.data.dataset.RetrievalDataset.image_source`: Karpathy image folders, webdataset
shards, person-search images, also when the model reads their precomputed features, rendered
synthetic worlds), each image shown is resized with PIL (bicubic, enlarged or reduced) to fit
``size`` x ``size`` and written as ``thumbs/{index}.jpg`` in the report folder. Precomputed
features have no pictures: captions and ids are shown instead. Pictures are read by
:func:`vlret._images.open_rgb` under a pixel cap checked from the file's header: an image over
it, or one that does not decode, stops the report in one line naming the file.

Boxes: the bottom-up-attention extraction writes one box per region, ``(x1, y1, x2, y2)`` in
the pixels of the original image. A precomputed folder may hold them as
``{split}_boxes.npy``, float ``(N_images, R, 4)`` in the row order of ``{split}_ims.npy``;
values all within ``[0, 1]`` are read as fractions of the image's width and height (a layout
some feature dumps use), larger ones as pixels (the canvas is then the original picture when
there is one, else the extent of the image's boxes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._extras import require
from ..._files import atomic_write
from ..._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb

#: the longest side of a thumbnail, pixels
THUMB_SIZE = 160


@dataclass
class Thumb:
    """A thumbnail written in the report folder: its path relative to the folder, its size
    and the size of the original picture."""

    path: str
    width: int
    height: int
    source_width: int
    source_height: int


def _picture(dataset: Any, index: int, max_pixels: int | None) -> Any:
    """The RGB PIL picture of image ``index``, or ``None`` where the data set has none.

    Raises:
        vlret._images.ImageReadError: The picture is over ``max_pixels`` or does not decode.
    """
    try:
        source = dataset.image_source(index)
    except (NotImplementedError, AttributeError, ValueError):
        # a split read from precomputed features that still names its pictures (person
        # search with data.features_dir): show them
        path = getattr(dataset, "image_path", None)
        source = path(index) if callable(path) else None
        if source is None or not Path(source).is_file():
            return None
    pil = require("PIL.Image", "report thumbnails")
    if isinstance(source, str | Path | pil.Image):
        return open_rgb(source, max_pixels=max_pixels)
    return None


def world_pictures(folder: Path, split: str) -> Callable[[int], Any] | None:
    """The rendered pictures of ``split`` when ``folder`` is a synthetic world read from its
    features (precomp: ``synthetic.json`` and ``{split}_synth.npz``), drawn from its scenes as
    ``vlret caption`` draws them (:func:`vlret.captioning.images.synthetic_images`, the
    same JPEG bytes as the world's Karpathy ``images/``); ``None`` for any other folder."""
    from ...worlds.hint import META_FILE

    if not (folder / META_FILE).is_file() or not (folder / f"{split}_synth.npz").is_file():
        return None
    from ...captioning.images import synthetic_images

    return synthetic_images(folder, split).load


def write_thumb(
    dataset: Any,
    index: int,
    out: Path,
    *,
    size: int = THUMB_SIZE,
    fallback: Callable[[int], Any] | None = None,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> Thumb | None:
    """Write the thumbnail of image ``index`` under ``out/thumbs/`` (once); ``None`` where the
    data set has no pictures. ``fallback``: the pictures of a data set that reads features
    (:func:`world_pictures`); ``max_pixels``: the pixel cap of the pictures read.

    Raises:
        vlret._images.ImageReadError: A picture over the cap (from its header) or one that
            does not decode (one line naming it).
    """
    picture = _picture(dataset, index, max_pixels)
    if picture is None and fallback is not None:
        picture = fallback(index)
    if picture is None:
        return None
    pil = require("PIL.Image", "report thumbnails")
    source_size = picture.size
    scale = size / max(picture.size)  # small pictures (tiny test worlds) are enlarged too
    shape = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
    picture = picture.resize(shape, resample=pil.Resampling.BICUBIC)
    rel = f"thumbs/{index}.jpg"
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: picture.save(fh, format="JPEG", quality=85))
    return Thumb(rel, picture.width, picture.height, *source_size)


def load_boxes(folder: Path, split: str, *, n_images: int) -> np.ndarray | None:
    """``{split}_boxes.npy`` of ``folder`` as float64 ``(N_images, R, 4)``, or ``None`` when the
    folder has none; a file of another shape is refused in one line naming it."""
    path = Path(folder) / f"{split}_boxes.npy"
    if not path.is_file():
        return None
    try:
        boxes = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise ValueError(f"{path}: not a numpy array file ({err})") from None
    if boxes.ndim != 3 or boxes.shape[2] != 4 or boxes.shape[0] != n_images:
        raise ValueError(
            f"{path}: expected ({n_images}, R, 4) boxes (x1, y1, x2, y2 per region), got shape "
            f"{tuple(boxes.shape)}"
        )
    out = np.asarray(boxes, dtype=np.float64)
    if not np.isfinite(out).all():
        raise ValueError(f"{path}: holds NaN or infinite values")
    return out


def box_canvas(boxes: np.ndarray, thumb: Thumb | None) -> tuple[np.ndarray, float, float]:
    """``(boxes scaled to [0, 1], canvas width, canvas height)`` of one image's ``(R, 4)``
    boxes (module docstring): fractions stay, pixels are divided by the original picture's
    size, or without one by the boxes' extent."""
    if boxes.size and float(np.abs(boxes).max()) <= 1.0:
        size = (thumb.width, thumb.height) if thumb else (THUMB_SIZE, THUMB_SIZE)
        return boxes, float(size[0]), float(size[1])
    if thumb is not None:
        sw, sh = float(thumb.source_width), float(thumb.source_height)
        w, h = float(thumb.width), float(thumb.height)
    else:
        sw = max(float(boxes[:, 2].max()), 1.0)
        sh = max(float(boxes[:, 3].max()), 1.0)
        scale = THUMB_SIZE / max(sw, sh)
        w, h = sw * scale, sh * scale
    scaled = boxes / np.array([sw, sh, sw, sh])
    return np.clip(scaled, 0.0, 1.0), w, h


__all__ = ["THUMB_SIZE", "Thumb", "box_canvas", "load_boxes", "write_thumb"]
