"""A split's images, in split order, for a captioner (``vlret caption --data DIR``).

* ``karpathy``: ``DIR`` holds one ``dataset_*.json`` (or is that file) and the image folder
  ``DIR/images`` (else ``DIR`` itself: COCO's ``train2014/``, ``val2014/``); the split's images
  are the JSON's in file order (``train`` includes restval), as
  :class:`~vlret.data.formats.karpathy.KarpathyDataset` serves them.
* ``precomp``: the rows of ``{split}_ims.npy``. Precomputed features carry no pixels, so only
  a synthetic world (``vlret synth``, ``synthetic.json`` and ``{split}_synth.npz``) has
  images: its rendered pictures (:func:`vlret.worlds.render_jpeg`, the same JPEG
  bytes as the Karpathy format's ``images/`` and the shards). Any other precomputed folder is
  refused, naming it.

Images are read by :func:`vlret._images.open_rgb` (every PIL mode and EXIF orientation read
the documented way) under a pixel cap checked from the file's header before decoding: an image
over it, or one that does not decode, stops the command in one line naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb
from ..data.checks import DataFormatError
from ..data.formats import KARPATHY, PRECOMP, formats_where, get_format

#: ``--format`` values: the formats whose splits read a captions file (a synthetic world's
#: precomputed split, whose pixels the world renders; a Karpathy JSON's image files).
IMAGE_FORMATS = formats_where(lambda f: f.captions_files)


@dataclass(frozen=True)
class SplitImages:
    """The images of one split: ``load(i)`` is image ``i`` as an RGB PIL image.

    Attributes:
        format: ``"precomp"`` or ``"karpathy"``.
        split: The split.
        names: One name per image (its file, or ``imgid N`` of a rendered world), for errors.
        describe: Where the images come from, for the sidecar.
    """

    format: str
    split: str
    names: tuple[str, ...]
    describe: str
    _load: Callable[[int], Any]

    def __len__(self) -> int:
        return len(self.names)

    def load(self, index: int) -> Any:
        """Image ``index`` as an RGB ``PIL.Image``."""
        return self._load(index)


def detect_format(root: Path) -> str:
    """``karpathy`` when ``root`` is or holds a ``dataset_*.json``, else ``precomp``."""
    if root.is_file() or any(root.glob("dataset_*.json")):
        return KARPATHY.name
    return PRECOMP.name


def _karpathy_json(root: Path) -> Path:
    if root.is_file():
        return root
    found = sorted(root.glob("dataset_*.json"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"{root}: expected one Karpathy JSON dataset_<name>.json in this folder, found "
            f"{[p.name for p in found] or 'none'}"
        )
    return found[0]


def karpathy_images(
    root: Path, split: str, *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> SplitImages:
    """The images of ``split`` of the Karpathy data in ``root`` (module docstring), read under
    the pixel cap ``max_pixels``."""
    from ..data.formats.karpathy_json import read_karpathy_json

    json_path = _karpathy_json(root)
    folder = json_path.parent
    image_root = folder / "images" if (folder / "images").is_dir() else folder
    data = read_karpathy_json(json_path)
    entries = data.split(split)
    if not entries:
        raise DataFormatError(json_path, f"has no images for the split {split!r}")
    paths = [im.path(image_root) for im in entries]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{missing[0]}: missing; {len(missing)} of the {len(paths)} images of the {split} "
            f"split listed in {json_path} are not under {image_root}"
        )
    return SplitImages(
        "karpathy",
        split,
        tuple(str(p) for p in paths),
        f"karpathy:{json_path}",
        lambda i: open_rgb(paths[i], max_pixels=max_pixels),
    )


def synthetic_images(root: Path, split: str) -> SplitImages:
    """The rendered pictures of ``split`` of the synthetic world in ``root``."""
    import numpy as np

    from ..worlds.hint import META_FILE
    from ..worlds.pixels import render_jpeg

    meta_path = root / META_FILE
    synth_path = root / f"{split}_synth.npz"
    if not meta_path.is_file() or not synth_path.is_file():
        raise DataFormatError(
            root,
            f"holds no images of the {split} split: a precomputed-feature folder has only "
            f"features ({split}_ims.npy); caption the images of the same dataset in the Karpathy "
            "format (--format karpathy: dataset_*.json + images/), or a synthetic world "
            f"(vlret synth: {META_FILE} and {split}_synth.npz)",
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    splits = meta.get("splits") or {}
    if split not in splits:
        raise DataFormatError(meta_path, f"has no split {split!r}; it has {list(splits)}")
    first = 0
    for name, summary in splits.items():  # imgids run over the splits in order
        if name == split:
            break
        first += int(summary["images"])
    with np.load(synth_path) as z:
        scenes = z["scenes"]
    seed = int(meta["seed"])

    def load(i: int) -> Any:
        scene = tuple(tuple(int(v) for v in obj) for obj in scenes[i] if obj[0] >= 0)
        data = render_jpeg(scene, seed=seed, imgid=first + i)
        return open_rgb(data, max_pixels=None, name=f"{synth_path} imgid {first + i}")

    names = tuple(f"imgid {first + i}" for i in range(len(scenes)))
    return SplitImages("precomp", split, names, f"synthetic:{root}", load)


def split_images(
    root: str | Path,
    split: str,
    *,
    format: str | None = None,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> SplitImages:
    """The images of ``split`` of the dataset in ``root``, in split order.

    Args:
        root: The data folder (or a Karpathy JSON file).
        split: Our split name (``train``, ``dev``, ``test``, ``testall``).
        format: ``"karpathy"``, ``"precomp"``, or None to detect (:func:`detect_format`).
        max_pixels: The pixel cap of the image files read (None: no cap); ``load`` of an
            image over it, or of one that does not decode, raises
            :class:`vlret._images.ImageReadError` naming the file.

    Returns:
        The split's images.

    Raises:
        FileNotFoundError: ``root`` or an image is missing.
        DataFormatError: The folder holds no images (a precomputed one that is no synthetic
            world), or its files are malformed.
        ValueError: An unknown format or split.
    """
    from .._extras import require

    require("PIL", "reading the images to caption")
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: missing; expected the data folder (--data)")
    format = format or detect_format(root)
    if format not in IMAGE_FORMATS:
        raise ValueError(f"format must be one of {IMAGE_FORMATS}, got {format!r}")
    if get_format(format).inputs == "pixels":  # Karpathy: the JSON's image files
        from ..data.formats.karpathy_json import SPLIT_MEMBERS

        if split not in SPLIT_MEMBERS:
            raise ValueError(f"split must be one of {tuple(SPLIT_MEMBERS)}, got {split!r}")
        return karpathy_images(root, split, max_pixels=max_pixels)
    from ..data.formats.precomp import SPLITS

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return synthetic_images(root, split)


__all__ = ["IMAGE_FORMATS", "SplitImages", "detect_format", "split_images"]
