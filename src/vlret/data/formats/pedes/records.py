"""The records of the person-search formats (``data.format`` ``cuhk-pedes``, ``icfg-pedes``,
``rstpreid``): one per layout of :data:`~vlret.data.formats.pedes.common.LAYOUTS`, read by
:mod:`vlret.data.formats.pedes.readers`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...transforms import capped
from ...vocab import build_vocab
from ..registry import DataFormat, OpenRequest, register_format
from .common import LAYOUTS
from .letterbox import person_eval_transform
from .readers import PersonSearchDataset, open_person_search, person_search_vocab_captions


def _open(data: Any, split: str, request: OpenRequest) -> PersonSearchDataset:
    # data.person_transform: IRRA's resize, a letterbox or the model's own transform
    image_transform = person_eval_transform(data, request.image_transform)
    return open_person_search(
        data.format,
        request.root,
        split,
        annotations=data.annotations,
        image_root=data.image_root,
        image_transform=capped(image_transform, data.max_image_pixels),
        encoder=request.encoder,
        features_dir=data.features_dir,
        max_images=request.max_images,
    )


def _vocabulary(data: Any) -> Any:
    """The train and val captions (never test)."""
    captions = person_search_vocab_captions(
        data.format, Path(data.root), annotations=data.annotations
    )
    return build_vocab(captions, min_count=data.min_count)


def _at_root(data: Any, root: Path) -> Any:
    """The run's annotation file, image folder and feature folder by their names in ``root``."""

    def named(name: str | None) -> str | None:
        return None if name is None else str(root / Path(name).name)

    return dataclasses.replace(
        data,
        root=str(root),
        annotations=named(data.annotations),
        image_root=named(data.image_root),
        features_dir=named(data.features_dir),
    )


def _reads_root(data: Any) -> bool:
    """Without its own annotation file and image (or feature) folder, both are in root."""
    return data.annotations is None or (data.image_root is None and data.features_dir is None)


def _record(name: str) -> DataFormat:
    layout = LAYOUTS[name]
    return register_format(
        DataFormat(
            name=name,
            summary=f"{layout.title} person search: the annotation JSON and imgs/ (IRRA's)",
            reader="vlret.data.formats.pedes.readers",
            open=_open,
            splits=layout.splits,
            inputs="pixels or features",
            caption_count_key=None,
            identities=True,
            owns=("annotations",),
            reads_root=_reads_root,
            vocabulary=_vocabulary,
            at_root=_at_root,
        )
    )


#: The three person-search formats, in :data:`~vlret.data.formats.pedes.common.LAYOUTS` order.
PERSON_SEARCH: tuple[DataFormat, ...] = tuple(_record(name) for name in LAYOUTS)

__all__ = ["PERSON_SEARCH"]
