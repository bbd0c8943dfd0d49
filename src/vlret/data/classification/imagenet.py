"""ImageNet-1k validation (ILSVRC2012 val, 50,000 images), the set CLIP reports as ImageNet.

Two layouts are read:

- **one folder per synset**: ``val/n01440764/*.JPEG``, ... (``ROOT/val`` or ``ROOT`` itself),
  what most users have after moving the images; label = the synset's place among the 1000
  sorted synsets (torchvision's ``ImageNet``/``ImageFolder`` order). A subset of the folders is
  read as such: the labels and class names still cover all 1000 classes.
- **the released flat folder** ``ILSVRC2012_img_val/ILSVRC2012_val_00000001.JPEG``, ... with the
  devkit's ``data/ILSVRC2012_validation_ground_truth.txt`` (line n: the ILSVRC2012 id of image
  n) and ``data/meta.mat``. The ids are **not** sorted-synset labels: each is mapped through
  ``meta.mat``'s ``synsets`` (``ILSVRC2012_ID`` -> ``WNID``) to its sorted-synset label.

Class names are CLIP's curated 1000-name list (``classnames/imagenet1k.txt``), index = sorted
synset, as CLIP_benchmark uses it.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..._extras import require
from ..checks import DataFormatError, read_lines
from ._set import (
    ClassificationSet,
    FileImages,
    check_split,
    image_files,
    require_images,
)
from ._shipped import shipped_classnames

WNID = re.compile(r"n\d{8}")
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
_FLAT = ("ILSVRC2012_img_val", "val", "")
_DEVKIT = ("ILSVRC2012_devkit_t12/data", "devkit/data", "data", "")
LAYOUTS = (
    "val/nXXXXXXXX/*.JPEG (one folder per synset), or ILSVRC2012_img_val/*.JPEG with the "
    f"devkit's ILSVRC2012_devkit_t12/data/{GROUND_TRUTH} and meta.mat"
)


def _synset_folders(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and WNID.fullmatch(p.name))


def _meta_ids(path: Path) -> dict[int, str]:
    """ILSVRC2012 id -> WNID of the 1000 leaf synsets of the devkit's ``meta.mat``."""
    sio = require("scipy.io", "reading ImageNet's devkit meta.mat")
    try:
        synsets = sio.loadmat(path, squeeze_me=True)["synsets"]
    except KeyError:
        raise DataFormatError(
            path, "has no 'synsets'; expected the ILSVRC2012 devkit's meta.mat"
        ) from None
    except Exception as err:  # scipy raises many kinds on a file that is not a .mat
        raise DataFormatError(path, f"not a readable .mat file ({err})") from None
    names = synsets.dtype.names or ()
    if "ILSVRC2012_ID" not in names or "WNID" not in names:
        raise DataFormatError(path, f"'synsets' has fields {names}; expected ILSVRC2012_ID, WNID")
    out: dict[int, str] = {}
    for rec in synsets.reshape(-1):
        children = int(rec["num_children"]) if "num_children" in names else 0
        if children == 0:
            out[int(rec["ILSVRC2012_ID"])] = str(rec["WNID"])
    return out


def _label_of(wnids: list[str]) -> dict[str, int]:
    return {w: i for i, w in enumerate(wnids)}


def _read_folders(
    base: Path, folders: list[Path], wnids: list[str]
) -> tuple[list[Path], list[int]]:
    label = _label_of(wnids)
    paths: list[Path] = []
    labels: list[int] = []
    for folder in folders:
        if folder.name not in label:
            raise DataFormatError(folder, "is not one of the 1000 ILSVRC2012 synsets")
        files = image_files(folder)
        paths.extend(files)
        labels.extend([label[folder.name]] * len(files))
    return paths, labels


def _find(root: Path, tops: tuple[str, ...], name: str) -> Path | None:
    for top in tops:
        path = (root / top / name) if top else (root / name)
        if path.exists():
            return path
    return None


def _read_flat(root: Path, wnids: list[str]) -> tuple[Path, list[Path], list[int]]:
    truth = _find(root, _DEVKIT, GROUND_TRUTH)
    images = next(
        (
            (root / t if t else root)
            for t in _FLAT
            if (root / t if t else root).is_dir()
            and (root / t / "ILSVRC2012_val_00000001.JPEG").exists()
        ),
        None,
    )
    if truth is None or images is None:
        raise FileNotFoundError(f"{root}: no ImageNet-1k validation set; expected {LAYOUTS}")
    meta = truth.parent / "meta.mat"
    if not meta.is_file():
        raise FileNotFoundError(f"{meta}: missing; expected the devkit's meta.mat beside {truth}")
    id_to_wnid = _meta_ids(meta)
    label = _label_of(wnids)
    paths: list[Path] = []
    labels: list[int] = []
    for number, line in enumerate(read_lines(truth, "one ILSVRC2012 id a line"), start=1):
        try:
            ilsvrc_id = int(line.strip())
        except ValueError:
            raise DataFormatError(
                truth, f"{line!r}; expected an ILSVRC2012 id (1-1000)", line=number
            ) from None
        wnid = id_to_wnid.get(ilsvrc_id)
        if wnid is None or wnid not in label:
            raise DataFormatError(
                truth,
                f"ILSVRC2012 id {ilsvrc_id} is not a class of {meta} (ids 1-1000 with a WNID)",
                line=number,
            )
        paths.append(images / f"ILSVRC2012_val_{number:08d}.JPEG")
        labels.append(label[wnid])
    require_images(paths, truth, "an ImageNet validation image")
    return images, paths, labels


def load_imagenet1k(root: str | Path, *, split: str = "val") -> ClassificationSet:
    """Read ImageNet-1k's validation set in either layout of the module docstring.

    Args:
        root: The ImageNet folder (holding ``val/`` or ``ILSVRC2012_img_val/`` and the devkit),
            or the ``val`` folder of synset folders itself.
        split: ``"val"``; ``"test"`` is accepted as its name (CLIP_benchmark's "test" split of
            ImageNet is its validation set; the labels of ILSVRC2012's test set were never
            released).

    Raises:
        FileNotFoundError: Neither layout under ``root``, or a listed image missing.
        DataFormatError: A synset folder that is not an ILSVRC2012 synset, a bad line of the
            ground truth (line named), or an unreadable ``meta.mat``.
        ValueError: Another split.
    """
    check_split("imagenet1k", split, ["val", "test"])
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: missing; expected a folder holding {LAYOUTS}")
    wnids = shipped_classnames("imagenet1k_wnids")
    classes = shipped_classnames("imagenet1k")
    for base in (root / "val", root):
        folders = _synset_folders(base)
        if folders:
            paths, labels = _read_folders(base, folders, wnids)
            if not paths:
                raise DataFormatError(base, "holds synset folders without an image in them")
            return ClassificationSet(
                "imagenet1k", "val", base, classes, labels, FileImages(tuple(paths))
            )
    images, paths, labels = _read_flat(root, wnids)
    return ClassificationSet("imagenet1k", "val", images, classes, labels, FileImages(tuple(paths)))
