"""The record of ``data.format = "webdataset"``: img2dataset / webdataset tar shards, read by
:mod:`vlret.data.formats.shards` (the training split streamed, the dev split read once).

A run trained on shards holds no paper test split: it is evaluated on Karpathy JSON + images
(``evaluated_as``), as AdaCL's CLIP pre-training is evaluated zero-shot on Flickr30K and
MS-COCO.
"""

from __future__ import annotations

from typing import Any

from .registry import DataFormat, OpenRequest, register_format
from .shards import ShardDevSet, ShardStream, build_shard_dev_set, build_shard_source


def _open(data: Any, split: str, request: OpenRequest) -> ShardStream | ShardDevSet:
    if split == "dev":
        return build_shard_dev_set(
            data,
            image_transform=request.image_transform,
            encoder=request.encoder,
            max_images=request.max_images,
        )
    if split != "train":
        raise ValueError(
            f"format 'webdataset' has the splits 'train' (data.shards) and 'dev' "
            f"(data.dev_shards), got {split!r}"
        )
    stream = request.stream
    if stream is None:
        raise ValueError(
            "format 'webdataset': the training split is a stream; open it with the training "
            "loop's settings (stream=StreamOptions(...))"
        )
    return build_shard_source(
        data,
        batch_size=stream.batch_size,
        seed=stream.seed,
        rank=stream.rank,
        world_size=stream.world_size,
        max_batches=stream.max_batches,
        image_transform=request.image_transform,
        augment=stream.augment,
        encoder=request.encoder,
    )


def _dev_split(data: Any) -> str | None:
    return "dev" if data.dev_shards else None


#: img2dataset / webdataset tar shards (``data.format = "webdataset"``).
WEBDATASET = register_format(
    DataFormat(
        name="webdataset",
        summary="img2dataset / webdataset tar shards, streamed (local files or URLs)",
        reader="vlret.data.formats.shards",
        open=_open,
        splits=("train", "dev"),
        inputs="pixels",
        streams=True,
        evaluated_as="karpathy",
        needs={
            "shards": "(a brace pattern or a list)",
            "train_num_samples": "(img2dataset writes no size file); expected a positive integer",
        },
        owns=("shards", "dev_shards"),
        dev_split=_dev_split,
    )
)

__all__ = ["WEBDATASET"]
