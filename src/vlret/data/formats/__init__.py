"""The data formats: one record per value of ``data.format`` in a registry, its reader beside it.

* :mod:`~vlret.data.formats.registry`: :class:`DataFormat` (what the harness asks of a format:
  splits, streaming, evaluation, caption counts, what it supports), :func:`register_format`,
  :func:`get_format`, :func:`format_names`.
* :mod:`~vlret.data.formats.precomp`: SCAN / VSE-infinity precomputed features.
* :mod:`~vlret.data.formats.karpathy`: Karpathy split JSON (parsed by
  :mod:`~vlret.data.formats.karpathy_json`) plus an image folder.
* :mod:`~vlret.data.formats.msrvtt`: MSR-VTT full and 1k-A with per-video frame features, and
  :mod:`~vlret.data.formats.experts`: their multi-expert features (CE, MMT).
* :mod:`~vlret.data.formats.webdataset`: img2dataset / webdataset tar shards, read by
  :mod:`~vlret.data.formats.shards`.
* :mod:`~vlret.data.formats.csv`: a CSV / TSV of image paths and captions (open_clip's).
* :mod:`~vlret.data.formats.pedes`: person search (CUHK-PEDES, ICFG-PEDES, RSTPReid).

:func:`open_dataset` opens one split of any registered format. Adding a format is one module
that registers its record (docs/adding-a-data-format.md) plus its test: the package imports
every module of its own when it is imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from ..paths import check_data_paths

# each format module registers its record on import, in this order (the order of
# format_names() and of the data.format choices)
# isort: off
from .precomp import PRECOMP
from .msrvtt import MSRVTT
from .karpathy import KARPATHY
from .webdataset import WEBDATASET
from .csv import CSV
from .pedes.records import PERSON_SEARCH

# isort: on
from .registry import (
    DataFormat,
    MissingDataKey,
    OpenRequest,
    StreamOptions,
    format_names,
    formats_where,
    get_format,
    register_format,
)

# then every other module of the package, in name order: a new format module registers itself
# without an edit here (its record after the built-in ones)
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def open_dataset(
    data: Any,
    split: str,
    *,
    encoder: Any = None,
    root: str | Path | None = None,
    max_images: int | None = None,
    protocol: str | None = None,
    image_transform: Any = None,
    stream: StreamOptions | None = None,
) -> Any:
    """One split of the data a ``[data]`` section describes, in its format
    (``data.format``'s record, :func:`get_format`).

    Args:
        data: The ``[data]`` section (a :class:`~vlret.data.config.DataConfig`).
        split: The split (the format's :attr:`DataFormat.splits`).
        encoder: The caption encoder; ``None`` reads the captions as text (to build a
            vocabulary from them).
        root: The data folder; default ``data.root``.
        max_images: Keep the split's first images only (a dev set).
        protocol: MSR-VTT's data protocol; default ``data.protocol``.
        image_transform: The model's image transform (pixel formats), applied to images read
            under ``data.max_image_pixels``.
        stream: A streaming format's training split: the training loop's settings.

    Returns:
        The split as a retrieval dataset (:class:`~vlret.data.dataset.RetrievalDataset`), or a
        stream of batches for a streaming format's training split.

    Raises:
        ValueError: An unknown format or split, or a path written from ``data.root`` (the fix
            named, before anything is read).
    """
    check_data_paths(data)  # a path written from data.root: the fix, before anything is read
    record = get_format(data.format)
    request = OpenRequest(
        encoder=encoder,
        root=Path(root if root is not None else data.root),
        max_images=max_images,
        protocol=protocol,
        image_transform=image_transform,
        stream=stream,
    )
    return record.open(data, split, request)


__all__ = [
    "CSV",
    "KARPATHY",
    "MSRVTT",
    "PERSON_SEARCH",
    "PRECOMP",
    "WEBDATASET",
    "DataFormat",
    "MissingDataKey",
    "OpenRequest",
    "StreamOptions",
    "format_names",
    "formats_where",
    "get_format",
    "open_dataset",
    "register_format",
]
