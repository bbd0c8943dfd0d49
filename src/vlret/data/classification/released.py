"""Food-101, Oxford Flowers-102, Oxford-IIIT Pets and FGVC-Aircraft in their released layouts.

Each reads its official split files; every image a split lists must exist (the first missing
one is named). Class names: Food-101's folder names with ``_`` as a space; Flowers-102's
shipped list (the release has none); Pets' shipped breed names, checked against the breed part
of every image name; FGVC-Aircraft's ``data/variants.txt`` (100 variants, the level CLIP
reports).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..._extras import require
from ..checks import DataFormatError, read_lines
from ._set import (
    ClassificationSet,
    FileImages,
    as_labels,
    check_split,
    find_root,
    require_images,
)
from ._shipped import read_classnames, shipped_classnames


def load_food101(root: str | Path, *, split: str = "test") -> ClassificationSet:
    """Read Food-101 (``food-101/meta/{split}.json``: class -> ``["class/id", ...]``; images
    ``images/<class>/<id>.jpg``). Classes sorted; names with ``_`` replaced by a space.

    Args:
        root: ``food-101`` or the folder holding it.
        split: ``"test"`` (25,250 images) or ``"train"``.

    Raises:
        FileNotFoundError: No ``meta/{split}.json`` under ``root``, or a listed image missing.
        DataFormatError: Not a JSON object of lists of ``"class/id"`` strings.
        ValueError: Another split.
    """
    check_split("food101", split, ["test", "train"])
    layout = "food-101/meta/test.json and food-101/images/<class>/<id>.jpg (Food-101's release)"
    top = find_root(Path(root), ["food-101"], f"meta/{split}.json", layout)
    path = top / "meta" / f"{split}.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise DataFormatError(
            path, f"not JSON ({err}); expected {{class: [class/id, ...]}}"
        ) from None
    if not isinstance(meta, dict) or not meta:
        raise DataFormatError(path, "expected a JSON object {class: [class/id, ...]}")
    classes = sorted(meta)
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        entries = meta[name]
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise DataFormatError(path, f"class {name!r}: expected a list of 'class/id' strings")
        paths.extend(top / "images" / f"{e}.jpg" for e in entries)
        labels.extend([label] * len(entries))
    require_images(paths, path, "a Food-101 image")
    names = [c.replace("_", " ") for c in classes]
    return ClassificationSet("food101", split, top, names, labels, FileImages(tuple(paths)))


def _mat(path: Path, key: str) -> np.ndarray:
    sio = require("scipy.io", "reading Flowers-102's .mat files")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected Flowers-102's {path.name}")
    try:
        data: dict[str, Any] = sio.loadmat(path)
    except Exception as err:  # scipy raises many kinds on a file that is not a .mat
        raise DataFormatError(path, f"not a readable .mat file ({err})") from None
    if key not in data:
        keys = ", ".join(k for k in data if not k.startswith("__"))
        raise DataFormatError(path, f"has no {key!r} (it has {keys})")
    return np.asarray(data[key]).reshape(-1)


_FLOWERS_SPLITS = {"test": "tstid", "train": "trnid", "val": "valid"}


def load_flowers102(root: str | Path, *, split: str = "test") -> ClassificationSet:
    """Read Oxford Flowers-102 (``jpg/image_00001.jpg``, ..., ``imagelabels.mat`` with 1-based
    ``labels``, ``setid.mat`` with ``trnid``, ``valid``, ``tstid``).

    Args:
        root: The folder holding the three (``flowers-102/`` under it is found too).
        split: ``"test"`` (``tstid``, 6,149 images, the official test set), ``"train"``
            (``trnid``) or ``"val"`` (``valid``).

    Raises:
        FileNotFoundError: No ``imagelabels.mat`` / ``setid.mat``, or a listed image missing.
        DataFormatError: An unreadable ``.mat``, a missing key, an image id outside the labels
            or a label outside 1-102.
        ValueError: Another split.
    """
    check_split("flowers102", split, list(_FLOWERS_SPLITS))
    layout = "jpg/image_00001.jpg ..., imagelabels.mat and setid.mat (Flowers-102's release)"
    top = find_root(Path(root), ["flowers-102", "flowers102"], "imagelabels.mat", layout)
    names = shipped_classnames("flowers102")
    all_labels = _mat(top / "imagelabels.mat", "labels")
    ids = _mat(top / "setid.mat", _FLOWERS_SPLITS[split])
    id_list = as_labels(ids - 1, top / "setid.mat", _FLOWERS_SPLITS[split], len(all_labels))
    labels = as_labels(all_labels - 1, top / "imagelabels.mat", "labels", len(names))
    paths = [top / "jpg" / f"image_{i + 1:05d}.jpg" for i in id_list]
    require_images(paths, top / "setid.mat", "a Flowers-102 image")
    return ClassificationSet(
        "flowers102", split, top, names, [labels[i] for i in id_list], FileImages(tuple(paths))
    )


def pets_breed(image: str) -> str:
    """The breed of a Pets image name, as torchvision names it: ``american_pit_bull_terrier_12``
    -> ``American Pit Bull Terrier``."""
    return " ".join(part.title() for part in image.rsplit("_", 1)[0].split("_"))


def load_pets(root: str | Path, *, split: str = "test") -> ClassificationSet:
    """Read Oxford-IIIT Pets (``annotations/{split}.txt`` lines ``Image CLASS-ID SPECIES
    BREED-ID``, class id 1-37; images ``images/<Image>.jpg``).

    Class names are the shipped 37 breed names; each line's image name must carry its class's
    breed (``pets_breed``), which catches a shifted or foreign annotation file.

    Args:
        root: ``oxford-iiit-pet`` or the folder holding it.
        split: ``"test"`` (3,669 images) or ``"trainval"``.

    Raises:
        FileNotFoundError: No ``annotations/{split}.txt``, or a listed image missing.
        DataFormatError: A malformed line, a class id outside 1-37 or a breed that does not
            match it (line named).
        ValueError: Another split.
    """
    check_split("pets", split, ["test", "trainval"])
    layout = "annotations/test.txt and images/<Image>.jpg (Oxford-IIIT Pets' release)"
    top = find_root(Path(root), ["oxford-iiit-pet"], f"annotations/{split}.txt", layout)
    path = top / "annotations" / f"{split}.txt"
    names = shipped_classnames("pets")
    paths: list[Path] = []
    labels: list[int] = []
    for number, line in enumerate(read_lines(path, "lines Image CLASS-ID SPECIES BREED-ID"), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 4 or not parts[1].isdigit():
            raise DataFormatError(
                path, f"{line!r}; expected Image CLASS-ID SPECIES BREED-ID", line=number
            )
        class_id = int(parts[1])
        if not 1 <= class_id <= len(names):
            raise DataFormatError(path, f"class id {class_id}; expected 1-37", line=number)
        if pets_breed(parts[0]) != names[class_id - 1]:
            raise DataFormatError(
                path,
                f"image {parts[0]!r} has class id {class_id} ({names[class_id - 1]}); its "
                f"name says {pets_breed(parts[0])}",
                line=number,
            )
        paths.append(top / "images" / f"{parts[0]}.jpg")
        labels.append(class_id - 1)
    require_images(paths, path, "a Pets image")
    return ClassificationSet("pets", split, top, names, labels, FileImages(tuple(paths)))


def load_fgvc_aircraft(root: str | Path, *, split: str = "test") -> ClassificationSet:
    """Read FGVC-Aircraft at the variant level (``data/images_variant_{split}.txt`` lines
    ``<image id> <variant>`` split at the first space; ``data/variants.txt``, one variant a
    line, line k = label k; images ``data/images/<id>.jpg``).

    Args:
        root: ``fgvc-aircraft-2013b`` or the folder holding it.
        split: ``"test"`` (3,333 images), ``"train"``, ``"val"`` or ``"trainval"``.

    Raises:
        FileNotFoundError: No ``data/variants.txt`` or split file, or a listed image missing.
        DataFormatError: A line without a variant, or a variant not in ``variants.txt``.
        ValueError: Another split.
    """
    check_split("fgvc_aircraft", split, ["test", "train", "val", "trainval"])
    layout = (
        "fgvc-aircraft-2013b/data/variants.txt, data/images_variant_test.txt and "
        "data/images/<id>.jpg (FGVC-Aircraft's release)"
    )
    top = find_root(Path(root), ["fgvc-aircraft-2013b"], "data/variants.txt", layout)
    names = read_classnames(top / "data" / "variants.txt")
    label = {n: i for i, n in enumerate(names)}
    path = top / "data" / f"images_variant_{split}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected {layout}")
    paths: list[Path] = []
    labels: list[int] = []
    for number, line in enumerate(read_lines(path, "lines <image id> <variant>"), 1):
        image, _, variant = line.strip().partition(" ")
        if not image or not variant:
            raise DataFormatError(path, f"{line!r}; expected <image id> <variant>", line=number)
        if variant not in label:
            raise DataFormatError(
                path, f"variant {variant!r} is not in {top / 'data' / 'variants.txt'}", line=number
            )
        paths.append(top / "data" / "images" / f"{image}.jpg")
        labels.append(label[variant])
    require_images(paths, path, "an FGVC-Aircraft image")
    return ClassificationSet("fgvc_aircraft", split, top, names, labels, FileImages(tuple(paths)))
