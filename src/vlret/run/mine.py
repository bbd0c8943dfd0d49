"""``vlret mine-negatives``: a trained checkpoint and a data folder to AOQ's mined file.

Loads the checkpoint as ``vlret eval`` does, reads the split with the run's data settings (the
run's noisy pairs on its training split), encodes it (two-tower) or prepares its pair scorer,
and mines it with :mod:`vlret.run.mining`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..data import check_features
from ..data.formats import open_dataset
from ..data.offline_negatives import FINGERPRINT, OfflineNegatives, split_fingerprint
from ..eval import PairModelScorer, TwoTowerScorer
from ..models import PairScorer
from .builders import load_trained_model, with_training_noise
from .devices import resolve_device
from .eval_data import eval_data_config
from .mining import BLOCK, DEFAULT_K, _positive, check_k, mine_embeddings, mine_pair_model


def mine_checkpoint(
    checkpoint: str | Path,
    *,
    data: str | Path,
    split: str = "train",
    k: int = DEFAULT_K,
    batch_size: int = 256,
    device: str = "auto",
    progress: bool = False,
    block_size: int = BLOCK,
) -> OfflineNegatives:
    """Load a ``vlret train`` checkpoint, read ``split`` of the data folder ``data`` with the
    checkpoint's data settings (:func:`~vlret.run.eval_data.eval_data_config`, as ``vlret
    eval``) and mine it; the header records the checkpoint, split, scoring, model kind and the
    split's :func:`~vlret.data.offline_negatives.split_fingerprint` (its image ids, captions
    and clean pairs, checked when the file is used for training). On
    the run's training split the run's noisy correspondence is applied (``data.noise_index`` /
    ``noise_ratio``, :mod:`vlret.data.noisy`): an item's own positives are the pairs AOQ's
    loader trains on, which is what it checks the file against.

    Raises:
        FileNotFoundError: A missing checkpoint or data folder.
        ValueError: An unreadable checkpoint, a bad split or ``k`` (named).
    """
    if not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the {split} split")
    _positive("batch_size", batch_size)
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise ValueError(f"device: {err}") from None
    model, run, encoder = load_trained_model(checkpoint, device=dev)
    settings = eval_data_config(run.data, data)
    dataset = open_dataset(
        settings, split, encoder=encoder, image_transform=getattr(model, "image_transform", None)
    )
    if split == settings.train_split:  # the run's training pairs: noisy ones stay noisy
        dataset = with_training_noise(settings, dataset)
    in_dim = getattr(getattr(model, "image_encoder", None), "in_dim", None)
    check_features(dataset, in_dim=in_dim if isinstance(in_dim, int) else None)
    check_k(k, dataset.num_images, torch.as_tensor(dataset.txt_to_img))  # before encoding
    options: dict[str, Any] = {"k": k, "block_size": block_size, "device": dev}
    if isinstance(model, PairScorer):
        scorer = PairModelScorer(model, batch_size=batch_size, device=dev, progress=progress)
        regions, texts = scorer.tokens(dataset)
        mined = mine_pair_model(
            model, regions, texts, dataset.txt_to_img, progress=progress, **options
        )
        scoring = "pair scores"
    else:
        tower = TwoTowerScorer(
            model, scoring=run.scoring, batch_size=batch_size, device=dev, progress=progress
        )
        img, txt = tower.embeddings(dataset)
        mined = mine_embeddings(img, txt, dataset.txt_to_img, progress=progress, **options)
        scoring = str(tower.scoring)
    kind = run.model.get("kind", type(model).__name__) if isinstance(run.model, dict) else None
    header = {
        **mined.header,
        "checkpoint": str(checkpoint),
        "split": split,
        "scoring": scoring,
        "model": kind or type(model).__name__,
        FINGERPRINT: split_fingerprint(dataset),  # what training checks the file against
    }
    return OfflineNegatives(
        mined.i2t, mined.t2i, mined.i2t_scores, mined.t2i_scores, mined.txt_to_img, header
    )


__all__ = ["mine_checkpoint"]
