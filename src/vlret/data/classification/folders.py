"""Sets stored as one folder per class: Caltech-101 and any image folder."""

from __future__ import annotations

import os
from pathlib import Path

from ..checks import DataFormatError
from ._set import IMAGE_SUFFIXES, ClassificationSet, FileImages, check_split, image_files
from ._shipped import read_classnames, shipped_classnames

BACKGROUND = "BACKGROUND_Google"


def _caltech_top(root: Path, layout: str) -> Path:
    """The ``101_ObjectCategories`` folder: ``root``, or under it."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: missing; expected {layout}")
    for top in (root / "101_ObjectCategories", root / "caltech101" / "101_ObjectCategories"):
        if top.is_dir():
            return top
    known = set(shipped_classnames("caltech101_folders"))
    if root.name == "101_ObjectCategories" or any(p.name in known for p in root.iterdir()):
        return root
    raise FileNotFoundError(f"{root}: no 101_ObjectCategories folder; expected {layout}")


def load_caltech101(
    root: str | Path, *, split: str = "test", background: bool = True
) -> ClassificationSet:
    """Read Caltech-101 (``101_ObjectCategories/<class>/image_0001.jpg``, ...).

    Caltech-101 releases no test split. This reader takes CLIP_benchmark's reading, which is
    the one CLIP-style papers' zero-shot tables follow: **every image is scored**, and
    ``BACKGROUND_Google`` is kept as a class (102 classes, ``Faces`` named "off-center face" and
    ``Faces_easy`` "centered face"). ``background=False`` gives torchvision's reading instead:
    ``BACKGROUND_Google`` and its images dropped, 101 classes. (VTAB's 30-per-class split,
    CLIP_benchmark's ``vtab/caltech101``, is not a released file and is not read here.)

    Labels follow the sorted folder names (``classnames/caltech101_folders.txt``); a root
    holding a subset of the folders is read as such.

    Args:
        root: ``101_ObjectCategories``, or the folder holding it (``caltech101/`` of
            torchvision holds it too).
        split: ``"test"``, meaning every image (there is no official split).
        background: Keep ``BACKGROUND_Google`` as a class (CLIP_benchmark) or drop it
            (torchvision).

    Raises:
        FileNotFoundError: No ``101_ObjectCategories`` under ``root``.
        DataFormatError: A folder that is not a Caltech-101 class, or no image at all.
        ValueError: Another split.
    """
    check_split("caltech101", split, ["test"])
    root = Path(root)
    layout = "101_ObjectCategories/<class>/*.jpg (Caltech-101's release)"
    top = _caltech_top(root, layout)
    folders = shipped_classnames("caltech101_folders")
    names = shipped_classnames("caltech101")
    if not background:
        folders, names = folders[1:], names[1:]
    label = {f: i for i, f in enumerate(folders)}
    paths: list[Path] = []
    labels: list[int] = []
    for folder in sorted(p for p in top.iterdir() if p.is_dir()):
        if folder.name == BACKGROUND and not background:
            continue
        if folder.name not in label:
            raise DataFormatError(
                folder, f"is not a Caltech-101 class folder; expected {layout} under {top}"
            )
        files = image_files(folder)
        paths.extend(files)
        labels.extend([label[folder.name]] * len(files))
    if not paths:
        raise DataFormatError(top, f"holds no image; expected {layout}")
    return ClassificationSet("caltech101", split, top, names, labels, FileImages(tuple(paths)))


#: names of folders that hold a split's class folders (:func:`load_imagefolder`)
SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "dev", "test"})


def _is_split_folder(folder: Path) -> bool:
    """A folder named like a split that holds folders (``ROOT/test/<class>/``): a class named
    ``train`` (CIFAR-100 has one) holds its images instead."""
    return folder.name.lower() in SPLIT_NAMES and any(p.is_dir() for p in folder.iterdir())


def class_images(folder: Path) -> list[Path]:
    """The image files anywhere under a class folder (:data:`IMAGE_SUFFIXES`, any case), as
    torchvision's ``ImageFolder`` finds them: the folder walked recursively, symbolic links
    followed (each real folder once, so a link cycle ends), hidden folders (``.name``, e.g.
    ``.ipynb_checkpoints``) skipped, ordered by folder then file name."""
    found: list[Path] = []
    seen: set[str] = set()
    for here, subfolders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(here)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        base = Path(here)
        found.extend(
            base / f
            for f in sorted(files)
            if Path(f).suffix.lower() in IMAGE_SUFFIXES and (base / f).is_file()
        )
    return found


def load_imagefolder(
    root: str | Path, *, split: str = "test", classnames: str | Path | None = None
) -> ClassificationSet:
    """Read one folder per class (``ROOT/<class>/*.jpg``; torchvision's ``ImageFolder``).

    Classes are the subfolders sorted by name; label k is the k-th. When ``ROOT/<split>`` is a
    folder of class folders (``ROOT/test/<class>/...``) it is read instead of ``ROOT``, so one
    root can hold several splits. Images are the files with an image suffix
    (:data:`vlret.data.classification._set.IMAGE_SUFFIXES`, any case) anywhere under a class
    folder: ``ROOT/<class>/<subfolder>/*.jpg`` counts for ``<class>``, as torchvision's
    ``ImageFolder`` reads it (``os.walk`` under each class; :func:`class_images`). Class
    names are the folder names as they are (``_`` kept) unless ``classnames`` gives them.

    A class folder without any image is refused, naming it, as torchvision refuses one
    ("Found no valid file for the classes ..."): it would be a class no image can be right
    about, changing every accuracy without a word. So is a root whose every "class" is a split
    folder of class folders (``train/<class>/``, ``val/<class>/``) when ``ROOT/<split>`` is
    not there: the split asked for is missing, and the others are no classes.

    Args:
        root: The folder.
        split: The split subfolder to read if it exists (see above).
        classnames: A file of class names, one a line, line k for the k-th sorted folder.

    Raises:
        FileNotFoundError: ``root`` is missing.
        DataFormatError: No class folder, a class folder without an image, split folders
            without the split asked for, or a ``classnames`` file with another number of
            names than folders.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: missing; expected a folder of class folders")
    top = root
    nested = root / split
    if split and nested.is_dir() and any(p.is_dir() for p in nested.iterdir()):
        top = nested
    folders = sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataFormatError(top, "holds no class folder; expected ROOT/<class>/<image>")
    if top == root and all(_is_split_folder(f) for f in folders):
        raise DataFormatError(
            root,
            f"holds split folders ({', '.join(f.name for f in folders)}) but no {split!r} "
            f"folder; expected ROOT/{split}/<class>/<image> or ROOT/<class>/<image>",
        )
    names = [f.name for f in folders]
    if classnames is not None:
        given = read_classnames(classnames)
        if len(given) != len(folders):
            raise DataFormatError(
                Path(classnames),
                f"holds {len(given)} class names for the {len(folders)} class folders of {top}",
            )
        names = given
    paths: list[Path] = []
    labels: list[int] = []
    empty: list[str] = []
    for i, folder in enumerate(folders):
        files = class_images(folder)
        if not files:
            empty.append(folder.name)
        paths.extend(files)
        labels.extend([i] * len(files))
    if empty:
        shown = ", ".join(empty[:5]) + (f" (and {len(empty) - 5} more)" if len(empty) > 5 else "")
        suffixes = "/".join(IMAGE_SUFFIXES)
        raise DataFormatError(
            top,
            f"class folders without an image ({suffixes}) anywhere under them: {shown}; "
            "expected ROOT/<class>/<image>",
        )
    return ClassificationSet("imagefolder", split, top, names, labels, FileImages(tuple(paths)))
