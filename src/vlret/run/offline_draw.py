"""AOQ's training split: the split wrapped so each item also yields offline negatives drawn
from ``data.offline_negatives`` (:mod:`vlret.data.offline_negatives`), after the mined file was
checked against the split it is drawn for (:func:`vlret.run.builders.build_train_dataset`)."""

from __future__ import annotations

from typing import Any

import torch

from ..data import RetrievalDataset
from ..data.config import DataConfig


def with_offline_negatives(data: DataConfig, dataset: RetrievalDataset, split: str) -> Any:
    """``dataset`` wrapped with the draw over ``data.offline_negatives`` (see
    :func:`vlret.run.builders.build_train_dataset`); the seed is the run's, given by the AOQ
    procedure.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is no mined file, or was mined on another split or pairing (the
            message names the file and both sizes or the first caption that differs), or
            ``data.offline_candidates`` exceeds its ``K`` (named).
    """
    from ..data.offline_negatives import OfflineNegativesDataset, load_offline_negatives

    path = data.offline_negatives
    if path is None:
        raise ValueError("data.offline_negatives: not set")
    mined = load_offline_negatives(
        path,
        num_images=dataset.num_images,
        num_captions=dataset.num_captions,
        txt_to_img=dataset.txt_to_img,
        split=split,
    )
    n = data.offline_candidates
    if n is not None and n > mined.k:
        raise ValueError(
            f"data.offline_candidates: {n} is more than the {mined.k} candidates per item of "
            f"{path} (set it to at most {mined.k}, or null for all)"
        )
    counts = torch.bincount(torch.as_tensor(dataset.txt_to_img), minlength=dataset.num_images)
    per_image = data.captions_per_image if int(counts.min()) != int(counts.max()) else None
    sampler = mined.sampler(candidates=n, captions_per_image=per_image)
    return OfflineNegativesDataset(dataset, sampler)
