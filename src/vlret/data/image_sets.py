"""The train and dev sets of a run on pixels read by vlret's own readers: webdataset shards
(:mod:`vlret.data.formats.shards`) and CSV / TSV pairs (:mod:`vlret.data.formats.csv`), the train
set
augmented as ``data.train_transform`` says; both count the samples they skip
(:mod:`vlret.data.bad_samples`). The other formats' train sets come from the trainer's builder
(:func:`vlret.run.builders.build_train_dataset`), which turns the same skipping on for a
Karpathy or person-search split read from image files."""

from __future__ import annotations

from typing import Any

from .formats.csv import build_csv_dataset
from .formats.shards import IMAGE_FORMATS, build_shard_dev_set, build_shard_source


def build_image_sets(
    config: Any,
    encoder: Any,
    eval_transform: Any,
    *,
    env: Any = None,
    dev: bool = True,
    other: Any = None,
) -> tuple[Any, Any]:
    """``(train set, dev set or None)`` of a run ``config`` with ``data.format``
    ``webdataset`` (a :class:`~vlret.data.formats.shards.ShardStream` and ``data.dev_shards``) or
    ``csv`` (``data.csv``, ``data.dev_csv``), the train set augmented as
    ``data.train_transform`` says (``eval_transform``: the model's; ``env``: ``rank`` and
    ``world_size``, None for one process; ``dev``: whether this process evaluates); for another
    format ``(other(data, train_split, encoder, image_transform=...), None)``: the trainer's
    builder, which builds that format's dev set."""
    from .formats.pedes.augment import build_augment

    data, tc = config.data, config.train
    augment = build_augment(data, eval_transform)  # data.train_transform's
    dev_set: Any = None
    if data.format not in IMAGE_FORMATS:
        assert other is not None, "the builder of the other formats"
        train = other(data, data.train_split, encoder, image_transform=eval_transform)
        if augment is not None:
            train.set_augment(augment, seed=tc.seed)
        return train, None
    if data.format == "csv":
        train = build_csv_dataset(data, "train", encoder, image_transform=eval_transform)
        if augment is not None:
            train.set_augment(augment, seed=tc.seed)
        if dev and data.dev_csv:
            dev_set = build_csv_dataset(data, "dev", encoder, image_transform=eval_transform)
        return train, dev_set
    stream = build_shard_source(
        data,
        batch_size=tc.batch_size,
        seed=tc.seed,
        rank=env.rank if env is not None else 0,
        world_size=env.world_size if env is not None else 1,
        max_batches=tc.max_steps_per_epoch,
        image_transform=eval_transform,
        augment=augment,
        encoder=encoder,
    )
    if dev and data.dev_shards:
        dev_set = build_shard_dev_set(
            data, image_transform=eval_transform, encoder=encoder, max_images=data.dev_max_images
        )
    return stream, dev_set


__all__ = ["build_image_sets"]
