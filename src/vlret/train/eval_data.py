"""The data a stored run is evaluated on: its training data config pointed at the folder
``vlret eval --data`` names (:func:`eval_data_config`), and a person-search run's config for
another person-search set (:func:`person_search_eval_data`, domain generalisation).

Shared by ``vlret eval``, ``vlret mine-negatives``, ``vlret compare`` and ``vlret plot tsne``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .config import DataConfig


def eval_data_config(data: DataConfig, root: str | Path) -> DataConfig:
    """The training run's data config pointed at the data folder ``root`` (``vlret eval --data``).

    ``precomp`` and ``msrvtt`` read their files from ``root`` itself. Person-search data reads
    the run's annotation file, image folder and feature folder (``data.features_dir``) by their
    names in ``root``. ``karpathy`` expects::

        root/
          dataset_<name>.json     the Karpathy JSON: the training config's file name, else the
                                  only dataset_*.json in root (root may also be the JSON file,
                                  and then its folder is the root)
          images/                 the image folder: the training config's image_root folder
                                  name, else images/, else root itself (COCO: root/val2014/...)
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: missing; expected the data folder of the test split")
    if data.format in ("cuhk-pedes", "icfg-pedes", "rstpreid"):  # the run's file names in root

        def named(name: str | None) -> str | None:
            return None if name is None else str(root / Path(name).name)

        return dataclasses.replace(
            data,
            root=str(root),
            annotations=named(data.annotations),
            image_root=named(data.image_root),
            features_dir=named(data.features_dir),
        )
    if data.format != "karpathy":
        return dataclasses.replace(data, root=str(root))
    if root.is_file():
        json_path, folder = root, root.parent
    else:
        folder = root
        stored = Path(data.karpathy_json).name if data.karpathy_json else None
        if stored and (folder / stored).is_file():
            json_path = folder / stored
        else:
            found = sorted(folder.glob("dataset_*.json"))
            if len(found) != 1:
                want = stored or "dataset_<name>.json"
                raise FileNotFoundError(
                    f"{folder}: expected the Karpathy JSON {want} in this folder, found "
                    f"{[p.name for p in found] or 'none'}"
                )
            json_path = found[0]
    image_root = None
    if data.image_root is not None:
        candidates = [folder / Path(data.image_root).name, folder / "images", folder]
        image_root = next(str(c) for c in candidates if c.is_dir())
    return dataclasses.replace(
        data, root=str(folder), karpathy_json=str(json_path), image_root=image_root
    )


#: what a training data source names that another format's evaluation data must not inherit
#: (:func:`person_search_eval_data`, :func:`vlret.train.evaluate.karpathy_eval_data`)
TRAINING_SOURCE_CLEARED: dict[str, Any] = {
    "shards": None,
    "dev_shards": None,
    "train_num_samples": None,
    "csv": None,
    "dev_csv": None,
    "train_transform": "none",
}


def person_search_eval_data(data: DataConfig, data_format: str) -> DataConfig:
    """The data config of a model trained on other data (Karpathy, precomp, shards, CSV) read as
    the person-search format ``data_format`` for evaluation without fine-tuning (``vlret eval
    CKPT --data DIR --protocol cuhk-pedes``: DIR holds the format's annotation file and
    ``imgs/``); the caption encoder and the model's image transform stay the checkpoint's (a
    224 x 224 CLIP sees its own preprocessing, not IRRA's 384 x 128 resize)."""
    return dataclasses.replace(
        data,
        format=data_format,
        karpathy_json=None,
        image_root=None,
        annotations=None,
        features_dir=None,
        **TRAINING_SOURCE_CLEARED,
    )
