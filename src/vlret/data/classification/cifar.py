"""CIFAR-10 and CIFAR-100 from their released python batches, read without running code.

The batches are pickles of a dict (``data``: uint8 ``N x 3072`` CHW planes; ``labels`` or
``fine_labels``; names in ``batches.meta`` / ``meta``), written by Python 2: read with
:class:`vlret.data.formats.experts.pickles.RestrictedUnpickler`, which builds dicts, lists, strings,
integers and numpy arrays only and refuses any other global (``os.system``, a custom class)
before importing or calling it, naming the file and the global. Keys may be ``str`` or
``bytes`` (a file re-pickled by Python 3 with ``encoding="bytes"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..checks import DataFormatError
from ..formats.experts.pickles import load_pickle
from ._set import ArrayImages, ClassificationSet, as_labels, check_split, find_root

#: per set: the top folder of the release, its meta file, the batches of each split, the key of
#: the labels and of the names
_LAYOUT: dict[str, dict[str, Any]] = {
    "cifar10": {
        "top": "cifar-10-batches-py",
        "meta": "batches.meta",
        "splits": {"test": ["test_batch"], "train": [f"data_batch_{i}" for i in range(1, 6)]},
        "labels": "labels",
        "names": "label_names",
        "classes": 10,
    },
    "cifar100": {
        "top": "cifar-100-python",
        "meta": "meta",
        "splits": {"test": ["test"], "train": ["train"]},
        "labels": "fine_labels",
        "names": "fine_label_names",
        "classes": 100,
    },
}


def _text(value: Any) -> Any:
    return value.decode("latin1") if isinstance(value, bytes) else value


def _load_dict(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """A released CIFAR pickle as a dict with ``str`` keys, holding ``keys``."""
    data = load_pickle(path)
    if not isinstance(data, dict):
        raise DataFormatError(path, f"holds a {type(data).__name__}; expected a CIFAR dict")
    out = {_text(k): v for k, v in data.items()}
    missing = [k for k in keys if k not in out]
    if missing:
        have = ", ".join(repr(k) for k in out)
        raise DataFormatError(path, f"has no {missing[0]!r} key (it has {have}); expected CIFAR")
    return out


def _names(path: Path, key: str, count: int, keep_underscores: bool) -> list[str]:
    raw = _load_dict(path, (key,))[key]
    if not isinstance(raw, list | tuple) or not all(isinstance(_text(n), str) for n in raw):
        raise DataFormatError(path, f"{key!r} is not a list of names")
    if len(raw) != count:
        raise DataFormatError(path, f"{key!r} holds {len(raw)} names; expected {count}")
    names = [_text(n) for n in raw]
    return names if keep_underscores else [n.replace("_", " ") for n in names]


def _batch(path: Path, key: str, count: int) -> tuple[np.ndarray, list[int]]:
    batch = _load_dict(path, ("data", key))
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        shown = f"shape {data.shape}, dtype {data.dtype}" if isinstance(data, np.ndarray) else ""
        raise DataFormatError(
            path, f"'data' is a {type(data).__name__} {shown}; expected uint8 N x 3072 (CHW)"
        )
    if data.shape[1] != 3 * 32 * 32:
        raise DataFormatError(path, f"'data' has {data.shape[1]} columns; expected 3072 (CHW)")
    labels = as_labels(batch[key], path, key, count)
    if len(labels) != data.shape[0]:
        raise DataFormatError(
            path, f"{len(labels)} {key} for {data.shape[0]} rows of 'data'; expected one a row"
        )
    return data, labels


def load_cifar(
    name: str, root: str | Path, *, split: str = "test", keep_underscores: bool = False
) -> ClassificationSet:
    """Read CIFAR-10 or CIFAR-100 (python version) from its released folder.

    Class names come from the release's meta file with ``_`` replaced by a space, which is
    CLIP's own CIFAR-100 list (``aquarium fish``; CLIP_benchmark keeps torchvision's
    underscores: ``keep_underscores=True``). CIFAR-100 is scored on its 100 fine labels.

    Args:
        name: ``"cifar10"`` or ``"cifar100"``.
        root: ``cifar-10-batches-py`` / ``cifar-100-python`` or the folder holding it.
        split: ``"test"`` (``test_batch`` / ``test``, the official test set) or ``"train"``.
        keep_underscores: Keep the meta file's names as they are (CLIP_benchmark's prompts).

    Raises:
        FileNotFoundError: No release under ``root`` or a missing batch.
        DataFormatError: A refused pickle (file and global named) or an unexpected content.
        ValueError: An unknown split.
    """
    layout = _LAYOUT[name]
    check_split(name, split, list(layout["splits"]))
    top = find_root(
        Path(root),
        [layout["top"]],
        layout["meta"],
        f"CIFAR's python batches ({layout['top']}/{layout['meta']}, ...)",
    )
    classes = _names(top / layout["meta"], layout["names"], layout["classes"], keep_underscores)
    datas, labels, files = [], [], []
    for batch in layout["splits"][split]:
        path = top / batch
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; expected the {name} {split} batch")
        data, ys = _batch(path, layout["labels"], layout["classes"])
        datas.append(data)
        labels.extend(ys)
        files.append(path)
    if len(datas) == 1:
        source = ArrayImages(files[0], datas[0])
        return ClassificationSet(name, split, top, classes, labels, source)
    return ClassificationSet(name, split, top, classes, labels, _Batches(files, datas))


class _Batches:
    """Several batches (CIFAR-10's training split) as one source, rows described per file."""

    def __init__(self, files: list[Path], datas: list[np.ndarray]) -> None:
        self.parts = [ArrayImages(f, d) for f, d in zip(files, datas, strict=True)]
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _locate(self, i: int) -> tuple[ArrayImages, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"image {i} of {len(self)}")
        part = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[part], i - int(self.starts[part])

    def image(self, i: int) -> Any:
        part, row = self._locate(i)
        return part.image(row)

    def describe(self, i: int) -> str:
        part, row = self._locate(i)
        return part.describe(row)
