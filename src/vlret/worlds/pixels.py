"""A world's rendered pictures for training from pixels (``vlret synth --webdataset |
--imagefolder``): webdataset shards in the img2dataset layout and image-folder classification
sets (``docs/synthetic.md``, "Pixels").

Every picture is the Karpathy format's (:func:`render_jpeg`: :func:`~.render.render_scene`
seeded by the world's seed and the image's ``imgid``, its index over the splits in order, saved
as a quality-90 JPEG), so the same image has the same bytes in ``images/``, in a shard and in an
image folder.

* **Shards** ``webdataset/<split>/00000.tar, ...``: members ``KEY.jpg``, ``KEY.json``,
  ``KEY.txt`` (webdataset's ``TarWriter`` order, as img2dataset writes them), ``KEY`` 9 digits,
  the shard id times 10^4 plus the sample's index in it, and ``00000_stats.json`` beside each
  tar. The train split holds one sample per (image, caption) pair (``shard_samples="pairs"``,
  the natural reading of CLIP-style pre-training on a K-caption world) or one per image with
  its first caption (``"images"``, img2dataset's one caption per image), in an order shuffled
  with the world's seed (web shards are not grouped by image; clone siblings are contiguous in
  the world); with noise, a train sample's json says whether its caption is ``clean``. Dev
  and test hold one sample per image in world order, the first caption in ``KEY.txt`` and all
  of them in the json's ``captions`` (a retrieval set with one caption per image, as the shard
  reader's ``dev_shards`` expects). Member times are 0 and owners fixed, so a seed gives
  byte-identical tars.
* **Image folders** ``imagefolder/<kind>/<split>/<class>/<imgid>.jpg``, one folder per class
  present in the split, for the label kinds of :data:`LABEL_KINDS`: the primary object's
  ``category`` and its ``colour`` (canonical names: ``square``, ``red``, ...).

A ``testall`` split (coco-like) is written as ``test``, as the Karpathy format names it.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .config import rng_stream
from .language import CATEGORIES, COLOURS, FIELD
from .scenes import Scene
from .splits import SyntheticSplit
from .world import SyntheticWorld

#: The folder of the shards inside a world.
SHARD_FOLDER = "webdataset"
#: The folder of the classification sets inside a world.
IMAGEFOLDER = "imagefolder"
#: Label kinds of the image folders: the field of the primary object that names the class.
LABEL_KINDS = ("category", "colour")
#: What a train shard sample is: an (image, caption) pair, or an image with its first caption.
SHARD_SAMPLES = ("pairs", "images")
#: The most samples a shard can hold: a KEY keeps the index in its last 4 digits.
MAX_SHARD_SIZE = 10_000
#: Default ``shard_size`` (``vlret synth --shard-size``).
DEFAULT_SHARD_SIZE = 1000
JPEG_QUALITY = 90
#: The random-stream purpose of the train shards' order (:func:`~.config.rng_stream`).
_SHUFFLE_PURPOSE = 6
_CLASS_NAMES = {
    "category": [names[0] for names in CATEGORIES],
    "colour": [names[0] for names in COLOURS],
}

Progress = Callable[[str], None]


def render_jpeg(scene: Scene, *, seed: int, imgid: int) -> bytes:
    """The JPEG bytes of image ``imgid`` of the world of ``seed``: the Karpathy format's
    picture (:func:`~.render.render_scene`, 64 x 64, quality 90)."""
    from .render import render_scene

    buf = io.BytesIO()
    image = render_scene(scene, seed=seed * 1_000_003 + imgid)
    image.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def folder_split(name: str) -> str:
    """The folder of split ``name``: ``testall`` is written as ``test``."""
    return "test" if name == "testall" else name


def first_imgids(world: SyntheticWorld) -> dict[str, int]:
    """The ``imgid`` of each split's first image (images are numbered over the splits in
    order, as in the Karpathy JSON)."""
    out, start = {}, 0
    for name, split in world.splits.items():
        out[name] = start
        start += split.num_images
    return out


def check_pixel_options(*, shard_size: int, shard_samples: str) -> None:
    """Refuse (``ValueError``, one line) a shard size or a train sample kind the layout
    cannot hold."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int | np.integer):
        raise ValueError(f"shard_size must be an integer, got {shard_size!r}")
    if not 1 <= shard_size <= MAX_SHARD_SIZE:
        raise ValueError(
            f"shard_size must be in 1..{MAX_SHARD_SIZE} (a KEY holds the sample's index in its "
            f"last 4 digits), got {shard_size}"
        )
    if shard_samples not in SHARD_SAMPLES:
        raise ValueError(f"shard_samples must be one of {SHARD_SAMPLES}, got {shard_samples!r}")


def shard_order(
    split: SyntheticSplit, *, seed: int, split_index: int, per: str
) -> list[tuple[int, int | None]]:
    """The samples of a split's shards in writing order: ``(image, caption)`` pairs with
    ``per="pairs"``, ``(image, None)`` (one per image) with ``per="images"``. A train split's
    order is shuffled with the world's seed; the others keep world order."""
    k = split.num_captions // max(split.num_images, 1)
    if per == "pairs":
        samples: list[tuple[int, int | None]] = [
            (i, c) for i in range(split.num_images) for c in range(k)
        ]
    else:
        samples = [(i, None) for i in range(split.num_images)]
    if split.name == "train":
        perm = rng_stream(seed, split_index, _SHUFFLE_PURPOSE).permutation(len(samples))
        samples = [samples[j] for j in perm]
    return samples


def shard_pattern(folder: str | Path, count: int) -> str:
    """The shards ``00000.tar`` .. of ``folder`` as a brace pattern (a single path for one)."""
    if count == 1:
        return f"{folder}/00000.tar"
    return f"{folder}/{{00000..{count - 1:05d}}}.tar"


def _write_shards(
    out: Path,
    samples: list[tuple[int, int | None]],
    jpegs: list[bytes],
    captions: list[str],
    *,
    clean: np.ndarray | None,
    k: int,
    first_imgid: int,
    split: str,
    shard_size: int,
    progress: Progress,
) -> int:
    """Write ``samples`` as shards of ``shard_size`` into ``out``; returns the shard count."""
    from PIL import Image

    from .._extras import require

    TarWriter = require("webdataset", "writing webdataset shards (--webdataset)").TarWriter

    out.mkdir(parents=True, exist_ok=True)
    sizes: dict[int, tuple[int, int]] = {}  # image -> (width, height), read once
    n_shards = 0
    for shard, start in enumerate(range(0, len(samples), shard_size)):
        chunk = samples[start : start + shard_size]
        tar = out / f"{shard:05d}.tar"
        with tar.open("wb") as fh, TarWriter(fh, encoder=False, mtime=0) as writer:
            for index, (image, caption) in enumerate(chunk):
                key = f"{shard * MAX_SHARD_SIZE + index:09d}"
                jpeg = jpegs[image]
                if image not in sizes:
                    sizes[image] = Image.open(io.BytesIO(jpeg)).size
                width, height = sizes[image]
                own = captions[image * k : (image + 1) * k]
                text = own[0] if caption is None else own[caption]
                record: dict[str, Any] = {
                    "key": key,
                    "caption": text,
                    "status": "success",
                    "error_message": None,
                    "width": width,
                    "height": height,
                    "original_width": width,
                    "original_height": height,
                    "exif": None,
                    "sha256": hashlib.sha256(jpeg).hexdigest(),
                    "split": split,
                    "imgid": first_imgid + image,
                    "image_index": image,
                }
                if caption is None:
                    record["captions"] = own
                else:
                    record["caption_index"] = caption
                if clean is not None:  # a noisy world's train split: is the caption right?
                    record["clean"] = bool(clean[image * k + (caption or 0)])
                writer.write(
                    {
                        "__key__": key,
                        "jpg": jpeg,
                        "txt": text.encode("utf-8"),
                        "json": json.dumps(record).encode("utf-8"),
                    }
                )
        stats = {
            "count": len(chunk),
            "successes": len(chunk),
            "failed_to_download": 0,
            "failed_to_resize": 0,
            "status_dict": {"success": len(chunk)},
        }
        (out / f"{shard:05d}_stats.json").write_text(json.dumps(stats, indent=4) + "\n")
        progress(f"{out / tar.name}: {len(chunk)} samples")
        n_shards += 1
    return n_shards


def _write_imagefolders(
    root: Path, split: SyntheticSplit, jpegs: list[bytes], *, name: str, first_imgid: int
) -> dict[str, dict[str, int]]:
    """Write the split's pictures into one folder per class of each label kind; returns
    ``kind -> class -> images``."""
    out: dict[str, dict[str, int]] = {}
    for kind in LABEL_KINDS:
        names = _CLASS_NAMES[kind]
        counts: dict[str, int] = {}
        base = root / IMAGEFOLDER / kind / name
        for i, scene in enumerate(split.scenes):
            cls = names[scene[0][FIELD[kind]]]
            folder = base / cls
            if cls not in counts:
                folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{first_imgid + i:06d}.jpg").write_bytes(jpegs[i])
            counts[cls] = counts.get(cls, 0) + 1
        out[kind] = dict(sorted(counts.items()))
    return out


def write_pixels(
    world: SyntheticWorld,
    root: Path,
    *,
    webdataset: bool,
    imagefolder: bool,
    shard_size: int = DEFAULT_SHARD_SIZE,
    shard_samples: str = "pairs",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the world's pictures as shards (``webdataset``) and image folders
    (``imagefolder``) under ``root`` (the module's layout); returns what ``synthetic.json``
    records of them: ``{"webdataset": {...}, "imagefolder": {...}}`` for those written.

    Args:
        world: The world.
        root: Its folder.
        webdataset: Write ``root/webdataset/<split>/``.
        imagefolder: Write ``root/imagefolder/<kind>/<split>/<class>/``.
        shard_size: Samples per shard (the last shard of a split holds the rest).
        shard_samples: ``pairs`` or ``images``: the train shards' samples.
        progress: Called with one line per shard and per image-folder split.
    """
    say = progress or (lambda line: None)
    k = world.config.captions_per_image
    firsts = first_imgids(world)
    shards: dict[str, Any] = {}
    folders: dict[str, dict[str, Any]] = {kind: {} for kind in LABEL_KINDS}
    for index, (name, split) in enumerate(world.splits.items()):
        say(f"rendering {name}: {split.num_images} images")
        jpegs = [
            render_jpeg(scene, seed=world.seed, imgid=firsts[name] + i)
            for i, scene in enumerate(split.scenes)
        ]
        folder = folder_split(name)
        if webdataset:
            per = shard_samples if name == "train" else "images"
            samples = shard_order(split, seed=world.seed, split_index=index, per=per)
            n = _write_shards(
                root / SHARD_FOLDER / folder,
                samples,
                jpegs,
                split.captions("raw"),
                clean=split.clean if world.noise is not None and name == "train" else None,
                k=k,
                first_imgid=firsts[name],
                split=name,
                shard_size=shard_size,
                progress=say,
            )
            shards[folder] = {
                "split": name,
                "pattern": shard_pattern(f"{SHARD_FOLDER}/{folder}", n),
                "shards": n,
                "samples": len(samples),
                "images": split.num_images,
                "per": per,
            }
        if imagefolder:
            counts = _write_imagefolders(root, split, jpegs, name=folder, first_imgid=firsts[name])
            for kind, classes in counts.items():
                folders[kind][folder] = classes
                say(
                    f"{root / IMAGEFOLDER / kind / folder}: {split.num_images} images in "
                    f"{len(classes)} classes"
                )
    out: dict[str, Any] = {}
    if webdataset:
        out["webdataset"] = {
            "folder": SHARD_FOLDER,
            "shard_size": shard_size,
            "train_samples": shard_samples,
            "splits": shards,
        }
    if imagefolder:
        out["imagefolder"] = {"folder": IMAGEFOLDER, "kinds": folders}
    return out


def class_names(kind: str) -> list[str]:
    """Every class name of label kind ``kind`` (the folders a split may have), in label
    order."""
    return list(_CLASS_NAMES[kind])


__all__ = [
    "DEFAULT_SHARD_SIZE",
    "IMAGEFOLDER",
    "LABEL_KINDS",
    "MAX_SHARD_SIZE",
    "SHARD_FOLDER",
    "SHARD_SAMPLES",
    "check_pixel_options",
    "class_names",
    "first_imgids",
    "folder_split",
    "render_jpeg",
    "shard_order",
    "shard_pattern",
    "write_pixels",
]
