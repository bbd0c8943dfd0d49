"""The data a stored run is evaluated on: its training data config pointed at the folder
``vlret eval --data`` names (:func:`eval_data_config`), and a person-search run's config for
another person-search set (:func:`person_search_eval_data`, domain generalisation).

Shared by ``vlret eval``, ``vlret mine-negatives``, ``vlret compare``, ``vlret report`` and
``vlret plot tsne``: a run trained on shards or a CSV is evaluated on Karpathy JSON + images
(:func:`karpathy_eval_data`, :func:`stored_eval_data`), and a protocol gives the split when none
is named (:func:`default_split`). :func:`member_eval_data` is the one adaptation an evaluation
makes of each member's stored data config: all of the above, the caption counts given, and the
data folder and split taken from the run where not given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from ..data.config import DataConfig
from ..data.formats import KARPATHY, DataFormat, formats_where, get_format
from ..data.formats.karpathy import KarpathyJsonNotFound
from ..eval import EvalProtocol, get_protocol
from ..worlds.hint import META_FILE as SYNTHETIC_META


def eval_data_config(data: DataConfig, root: str | Path) -> DataConfig:
    """The training run's data config pointed at the data folder ``root`` (``vlret eval --data``):
    the format's :attr:`~vlret.data.formats.DataFormat.at_root`.

    ``precomp`` and ``msrvtt`` read their files from ``root`` itself. Person-search data reads
    the run's annotation file, image folder and feature folder (``data.features_dir``) by their
    names in ``root``. ``karpathy``
    (:func:`~vlret.data.formats.karpathy.karpathy_at_root`) expects::

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
    try:
        return get_format(data.format).at_root(data, root)
    except KarpathyJsonNotFound as err:
        raise FileNotFoundError(f"{err}{_karpathy_fix(err.folder, err.found)}") from None


def _karpathy_fix(folder: Path, found: list[Path]) -> str:
    """How to point ``vlret eval`` at Karpathy data, for the error of a folder without one JSON:
    a synthetic world written in another format is rewritten with ``--format karpathy``."""
    if found:
        return "; pass the one to evaluate as --data FILE"
    meta = folder / SYNTHETIC_META
    if meta.is_file():
        try:
            written = json.loads(meta.read_text(encoding="utf-8")).get("format")
        except (json.JSONDecodeError, AttributeError, OSError):
            written = None
        if written is not None and written != KARPATHY.name:
            return (
                f"; this synthetic world was written in the {written} format: write it with "
                "`vlret synth PRESET --out DIR --format karpathy` (plus --webdataset for shards) "
                "to get its Karpathy JSON and images"
            )
    return (
        "; --data names the folder of a Karpathy JSON (dataset_<name>.json with images/) or "
        "the JSON file itself"
    )


#: what a training data source names that another format's evaluation data must not inherit
#: (:func:`person_search_eval_data`, :func:`karpathy_eval_data`)
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
    ``imgs/``); the caption encoder stays the checkpoint's, and the pictures are letterboxed
    into the model's input (``data.person_transform = "letterbox"``, unless the run set
    another: a 224 x 224 CLIP's own centre crop would cut a 3:1 pedestrian's head and feet
    off, :mod:`vlret.data.formats.pedes.letterbox`)."""
    return dataclasses.replace(
        data,
        format=data_format,
        person_transform=data.person_transform or "letterbox",
        karpathy_json=None,
        image_root=None,
        annotations=None,
        features_dir=None,
        **TRAINING_SOURCE_CLEARED,
    )


def karpathy_eval_data(data: DataConfig) -> DataConfig:
    """The data config of a model trained from pixels on shards or a CSV, read as Karpathy JSON +
    images for evaluation (``vlret eval CKPT --data DIR``: ``DIR/dataset_*.json`` and
    ``DIR/images/``, five captions per image); the caption encoder stays the checkpoint's."""
    return dataclasses.replace(
        data,
        format=KARPATHY.name,
        karpathy_json=None,
        image_root="images",
        captions_per_image=5,
        **TRAINING_SOURCE_CLEARED,
    )


def stored_eval_data(data: DataConfig, *, protocol: str | EvalProtocol | None = None) -> DataConfig:
    """A stored run's data config read as the data it is evaluated on: a person-search
    ``protocol`` of a run trained on other data reads the protocol's format
    (:func:`person_search_eval_data`, domain generalisation), a run trained on shards or a CSV
    reads Karpathy JSON + images (:func:`karpathy_eval_data`), any other run its own format.
    Shared by ``vlret eval``, ``report``, ``compare`` and ``plot tsne``."""
    chosen = get_protocol(protocol) if protocol is not None else None
    if chosen is not None and chosen.relevance_kind.identities and data.format not in chosen.splits:
        (person_format,) = chosen.splits
        return person_search_eval_data(data, person_format)
    if get_format(data.format).evaluated_as == KARPATHY.name:  # shards, CSV: no test split
        return karpathy_eval_data(data)
    return data


def default_split(protocol: str | EvalProtocol, *, data_format: str) -> str:
    """The split ``vlret eval`` scores when ``--split`` is not given: the first split
    ``protocol`` evaluates in ``data_format`` (the format of :func:`stored_eval_data`), its
    paper's test split (``f30k``: ``test``; ``coco5k`` / ``coco1k``: ``testall`` of precomp
    data, ``test`` of a Karpathy JSON; person search: ``test``).

    Raises:
        ValueError: The protocol does not evaluate ``data_format`` data.
    """
    chosen = get_protocol(protocol)
    if data_format not in chosen.splits:
        raise ValueError(
            f"protocol {chosen.name} evaluates {' or '.join(chosen.splits)} data, not "
            f"{data_format} data"
        )
    return chosen.splits[data_format][0]


@dataclasses.dataclass(frozen=True)
class EvalData:
    """What one member of an evaluation reads (:func:`member_eval_data`): its data config as
    evaluated, pointed at the data folder ``root``, the ``split``, and why each default was
    taken (``why``: ``"data"`` or ``"split"`` -> the reason, what ``vlret eval`` prints)."""

    config: DataConfig
    root: Path
    split: str
    why: dict[str, str] = dataclasses.field(default_factory=dict)


def _counts_captions(record: DataFormat, *, key: str) -> bool:
    return record.caption_count_key == key


def member_eval_data(
    trained: DataConfig,
    *,
    protocol: str | EvalProtocol,
    source: str,
    data: str | Path | None = None,
    split: str | None = None,
    counts: Mapping[str, int | None] | None = None,
    same_as: tuple[str, str] | None = None,
) -> EvalData:
    """The data a member trained on ``trained`` is evaluated on under ``protocol``, in one
    step: the stored config read as the protocol's data (:func:`stored_eval_data`), the caption
    ``counts`` given (``captions_per_image`` / ``captions_per_video``; ``None`` keeps the
    stored one), the ``split`` (default: the protocol's test split of that data,
    :func:`default_split`), and the folder ``data`` (default: the run's ``data.root``, a path
    relative to the folder the run was trained from), which the config is pointed at
    (:func:`eval_data_config`). ``source`` (the checkpoint) is named in the errors;
    ``same_as``: ``(source, data format)`` of an ensemble's first member, whose data format
    this member's must be.

    Raises:
        FileNotFoundError: The data folder (given, or the run's) is missing, or lacks what its
            format reads first (a Karpathy JSON).
        ValueError: A caption count of another format, a split the protocol does not evaluate
            in that data, no data folder to take (a run evaluated on another data set), or an
            ensemble member trained on other data than ``same_as``.
    """
    chosen = get_protocol(protocol)
    evaluated = stored_eval_data(trained, protocol=chosen)
    if same_as is not None and evaluated.format != same_as[1]:
        raise ValueError(
            "the ensemble's checkpoints were trained on different data: "
            f"{same_as[0]} {same_as[1]}, {source} {evaluated.format}"
        )
    given: dict[str, Any] = {k: v for k, v in (counts or {}).items() if v is not None}
    for key in given:
        if get_format(evaluated.format).caption_count_key != key:
            users = formats_where(partial(_counts_captions, key=key))
            raise ValueError(
                f"{key}: only used with {' or '.join(users)} data; "
                f"{source} was trained on {evaluated.format} data"
            )
    if given:
        evaluated = dataclasses.replace(evaluated, **given)
    why: dict[str, str] = {}
    if split is None:
        try:
            split = default_split(chosen, data_format=evaluated.format)
        except ValueError as err:
            raise ValueError(f"{source}: {err} (it was trained on {trained.format} data)") from None
        why["split"] = f"protocol {chosen.name}'s test split of {evaluated.format} data"
    else:
        try:
            chosen.check_split(split, evaluated.format)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
    if data is None:
        if evaluated.format != trained.format and get_format(trained.format).evaluated_as is None:
            raise ValueError(
                f"--data: {source} was trained on {trained.format} data and protocol "
                f"{chosen.name} evaluates {evaluated.format} data; pass its folder with --data"
            )
        if not Path(trained.root).exists():
            raise FileNotFoundError(
                f"{source}: its data.root {trained.root} is missing (relative paths start from "
                "the folder the run was trained from); pass the data folder with --data"
            )
        data = trained.root
        why["data"] = "the run's data.root"
    root = Path(data)
    return EvalData(eval_data_config(evaluated, root), root, split, why)
