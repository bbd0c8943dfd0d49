"""Zero-shot image classification sets, read from their released on-disk layouts.

The eight sets CLIP-style papers report (AdaCL Table 10, CLIP_benchmark's suite) plus any
folder of class folders, each read from the files its authors release, on its official test
split:

- ``imagenet1k``: ``val/nXXXXXXXX/*.JPEG``, or ``ILSVRC2012_img_val/`` with the devkit's
  ground truth and ``meta.mat``; the validation set (50,000 images).
- ``cifar10`` / ``cifar100``: ``cifar-10-batches-py/test_batch`` / ``cifar-100-python/test``
  (10,000 images each).
- ``caltech101``: ``101_ObjectCategories/<class>/*.jpg``; every image (no official split).
- ``food101``: ``food-101/meta/test.json`` and ``images/`` (25,250 images).
- ``flowers102``: ``jpg/``, ``imagelabels.mat``, ``setid.mat``; ``tstid`` (6,149 images).
- ``pets``: ``oxford-iiit-pet/annotations/test.txt`` and ``images/`` (3,669 images).
- ``fgvc_aircraft``: ``fgvc-aircraft-2013b/data/images_variant_test.txt`` (3,333 images).
- ``imagefolder``: ``<class>/*.jpg`` (or ``test/<class>/*.jpg``); every image.

:func:`load_classification` returns a :class:`ClassificationSet`: human-readable class names
(index = label), one label per image, and images decoded on demand. Class names and prompt
templates ship as package data (``classnames/``, ``templates/``), each file naming its source
(CLIP's lists as CLIP_benchmark ships them); :func:`default_templates` gives a set's own
templates and :func:`load_templates` reads ``--templates``. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..._images import DEFAULT_MAX_IMAGE_PIXELS
from ..checks import DataFormatError
from ._set import IMAGE_SUFFIXES, ArrayImages, ClassificationSet, FileImages, ImageSource
from ._shipped import default_templates, load_templates, read_classnames
from .cifar import load_cifar
from .folders import load_caltech101, load_imagefolder
from .imagenet import load_imagenet1k
from .released import load_fgvc_aircraft, load_flowers102, load_food101, load_pets

DATASETS: tuple[str, ...] = (
    "imagenet1k",
    "cifar10",
    "cifar100",
    "caltech101",
    "food101",
    "flowers102",
    "pets",
    "fgvc_aircraft",
    "imagefolder",
)


def load_classification(
    name: str,
    root: str | Path,
    *,
    split: str = "test",
    classnames: str | Path | None = None,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> ClassificationSet:
    """Read a classification set from its released layout.

    Args:
        name: One of :data:`DATASETS`.
        root: The set's folder (the release's top folder, or the folder holding it).
        split: The split; ``"test"`` is each set's official test split (ImageNet-1k's
            validation set, every Caltech-101 image). Others: ``"train"`` (CIFAR, Food-101,
            Flowers-102, FGVC-Aircraft), ``"val"`` (Flowers-102, FGVC-Aircraft, ImageNet-1k),
            ``"trainval"`` (Pets, FGVC-Aircraft).
        classnames: A file of class names, one a line, replacing the set's own (line k names
            label k; as many lines as classes).
        max_pixels: The pixel cap of the image files (``data.max_image_pixels``; None: no
            cap): ``image(i)`` of a larger one raises :class:`vlret._images.ImageTooLarge`
            from its header, before decoding.

    Returns:
        The set.

    Raises:
        ValueError: An unknown set or split.
        FileNotFoundError: A missing root or file (the layout expected is named).
        DataFormatError: A file that does not hold what its layout requires (file and line
            named), or a ``classnames`` file with another number of names.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset {name!r}: expected one of {', '.join(DATASETS)}")
    data = _read(name, root, split=split, classnames=classnames)
    if isinstance(data.source, FileImages) and data.source.max_pixels != max_pixels:
        source = dataclasses.replace(data.source, max_pixels=max_pixels)
        return dataclasses.replace(data, source=source)
    return data


def _read(
    name: str, root: str | Path, *, split: str, classnames: str | Path | None
) -> ClassificationSet:
    """:func:`load_classification` at the default pixel cap."""
    if name == "imagefolder":
        return load_imagefolder(root, split=split, classnames=classnames)
    if name in ("cifar10", "cifar100"):
        data = load_cifar(name, root, split=split)
    else:
        reader = {
            "imagenet1k": load_imagenet1k,
            "caltech101": load_caltech101,
            "food101": load_food101,
            "flowers102": load_flowers102,
            "pets": load_pets,
            "fgvc_aircraft": load_fgvc_aircraft,
        }[name]
        data = reader(root, split=split)
    if classnames is None:
        return data
    given = read_classnames(classnames)
    if len(given) != len(data.classnames):
        raise DataFormatError(
            Path(classnames),
            f"holds {len(given)} class names; {name} has {len(data.classnames)} classes",
        )
    return ClassificationSet(data.name, data.split, data.root, given, data.labels, data.source)


__all__ = [
    "DATASETS",
    "IMAGE_SUFFIXES",
    "ArrayImages",
    "ClassificationSet",
    "FileImages",
    "ImageSource",
    "default_templates",
    "load_caltech101",
    "load_cifar",
    "load_classification",
    "load_fgvc_aircraft",
    "load_flowers102",
    "load_food101",
    "load_imagefolder",
    "load_imagenet1k",
    "load_pets",
    "load_templates",
    "read_classnames",
]
