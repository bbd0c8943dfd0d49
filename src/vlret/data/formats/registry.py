"""The data-format registry: one :class:`DataFormat` record per value of ``data.format``.

A record declares what the harness needs to know about a format: its name, the module of its
reader, the splits it reads, whether its training split streams, the format a run trained on it
is evaluated in, its caption-count key, what it supports (noisy-correspondence indexes, captions
files, AOQ's offline negatives, identities, multi-expert features), whether it serves pixels or
features, the ``[data]`` keys it requires or alone reads, and three functions: ``open`` (one
split as a dataset), ``vocabulary`` (the vocabulary built from its training captions; ``None``:
the format needs a tokenizer) and ``at_root`` (the config pointed at another data folder,
``vlret eval --data``). Each reader module registers its own record
(:func:`register_format`), the way each protocol module registers its protocol; nothing outside
the registry and the readers compares a format's name. :func:`vlret.data.formats.open_dataset`
opens a split of any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

#: What a format's split serves the model: images read from files, precomputed features, or
#: either (person search: images, or ``data.features_dir``).
INPUTS = ("pixels", "features", "pixels or features")
#: The caption-count keys of ``[data]``.
CAPTION_COUNT_KEYS = ("captions_per_image", "captions_per_video")


@dataclass(frozen=True, kw_only=True)
class OpenRequest:
    """What :func:`~vlret.data.formats.open_dataset` asks a format's ``open`` for, beside the
    data config and the split.

    Attributes:
        encoder: The caption encoder (a vocabulary or tokenizer); ``None`` reads the captions
            as text only (a vocabulary is being built from them).
        root: The data folder (``data.root`` unless given).
        max_images: Keep the split's first images only (a dev set).
        protocol: MSR-VTT's data protocol (``data.protocol`` unless given).
        image_transform: The model's image transform (pixel formats).
        stream: The training stream's settings (a streaming format's training split).
    """

    encoder: Any = None
    root: Path
    max_images: int | None = None
    protocol: str | None = None
    image_transform: Any = None
    stream: StreamOptions | None = None


@dataclass(frozen=True, kw_only=True)
class StreamOptions:
    """The training loop's side of a streamed training split (webdataset shards): the batch
    size and seed, this process's ``rank`` of ``world_size``, the cap on batches per epoch
    and the training augmentation (``data.train_transform``'s, or ``None``)."""

    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1
    max_batches: int | None = None
    augment: Any = None


class MissingDataKey(ValueError):
    """A ``[data]`` key a format's function needs and the config leaves unset; the harness
    names it as the config's error (``data.<key>``)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"data.{key}: {why}")
        self.key, self.why = key, why


def _own_root(data: Any, root: Path) -> Any:
    """The default ``at_root``: the format reads its files from the folder itself."""
    return dataclasses.replace(data, root=str(root))


def _configured_dev_split(data: Any) -> str | None:
    """The default ``dev_split``: ``data.dev_split``."""
    return data.dev_split


@dataclass(frozen=True, kw_only=True)
class DataFormat:
    """One data format: the record the harness asks instead of comparing names.

    Attributes:
        name: The value of ``data.format`` (``"karpathy"``).
        summary: One line for listings and the key reference.
        reader: The module of its reader (``"vlret.data.formats.karpathy"``).
        open: ``open(data, split, request)``: one split as a dataset (or a stream), given the
            ``[data]`` config and an :class:`OpenRequest`.
        splits: The split names it reads.
        inputs: What a split serves (:data:`INPUTS`).
        streams: Its training split is a stream (no length known before reading; resumed by
            batch position), not a map-style dataset.
        evaluated_as: The format a run trained on it is evaluated in (a run trained on shards
            or a CSV is evaluated on Karpathy JSON + images); ``None``: its own.
        caption_count_key: The ``[data]`` key of its captions per visual item, which ``vlret
            eval`` may override; ``None``: the format has none.
        visual: ``"image"`` or ``"video"``.
        noise_index: Noisy correspondence applies to its training split (one image per
            caption).
        captions_files: Its splits can read a captions file (``data.train_captions`` ...).
        offline_negatives: AOQ's offline negatives apply to its training split.
        identities: Its captions and images carry person identities (person search).
        experts: It reads multi-expert video features (``data.experts``).
        needs: ``[data]`` keys it requires, each with why, as the message continues
            (``{"csv": "(a CSV/TSV of image paths and captions)"}``).
        owns: ``[data]`` keys only it reads (set with another format: an error).
        reads_root: ``data.root`` must be a folder it reads files from; a callable decides
            from the config (person search: only without its own file keys).
        vocabulary: ``vocabulary(data)``: the vocabulary built from its training captions
            (:class:`MissingDataKey` when a key it reads is unset); ``None``: the format builds
            none (a tokenizer or ``data.vocab`` is needed).
        at_root: ``at_root(data, root)``: the config pointed at the data folder ``root``
            (``vlret eval --data``).
        dev_split: ``dev_split(data)``: the split the trainer validates on, or ``None``.
        data_set: ``data_set(data, root)``: the data set a raw ``[data]`` table (a dict, read
            before it is checked) holds, as far as its files or names tell (``"coco"``,
            ``"flickr30k"``), with ``root`` the folder it is tested on; ``None`` when they do not
            tell (``vlret compare`` picks MS-COCO's protocol for ``"coco"``).
    """

    name: str
    summary: str
    reader: str
    open: Callable[[Any, str, OpenRequest], Any]
    splits: tuple[str, ...]
    inputs: str
    streams: bool = False
    evaluated_as: str | None = None
    caption_count_key: str | None = None
    visual: str = "image"
    noise_index: bool = False
    captions_files: bool = False
    offline_negatives: bool = False
    identities: bool = False
    experts: bool = False
    needs: Mapping[str, str] = field(default_factory=dict)
    owns: tuple[str, ...] = ()
    reads_root: bool | Callable[[Any], bool] = False
    vocabulary: Callable[[Any], Any] | None = None
    at_root: Callable[[Any, Path], Any] = _own_root
    dev_split: Callable[[Any], str | None] = _configured_dev_split
    data_set: Callable[[Mapping[str, Any], str | None], str | None] | None = None

    def __post_init__(self) -> None:
        if self.inputs not in INPUTS:
            raise ValueError(f"format {self.name}: inputs must be one of {INPUTS}")
        if self.caption_count_key not in (None, *CAPTION_COUNT_KEYS):
            raise ValueError(
                f"format {self.name}: caption_count_key must be one of {CAPTION_COUNT_KEYS}"
            )
        if self.visual not in ("image", "video"):
            raise ValueError(f"format {self.name}: visual must be 'image' or 'video'")

    def root_required(self, data: Any) -> bool:
        """Whether ``data.root`` must be a folder for this config (:attr:`reads_root`)."""
        return self.reads_root(data) if callable(self.reads_root) else self.reads_root

    @property
    def evaluated_format(self) -> str:
        """The name of the format its runs are evaluated in (:attr:`evaluated_as` or its own)."""
        return self.evaluated_as or self.name


_REGISTRY: dict[str, DataFormat] = {}


def register_format(record: DataFormat) -> DataFormat:
    """Add a format to the registry (each reader module registers its own); returns it.

    Raises:
        ValueError: Another format of the same name is registered.
    """
    known = _REGISTRY.get(record.name)
    if known is not None and known is not record:
        raise ValueError(f"data format {record.name!r} is already registered")
    _REGISTRY[record.name] = record
    return record


def format_names() -> tuple[str, ...]:
    """The registered values of ``data.format``, in registration order."""
    return tuple(_REGISTRY)


def get_format(name: str | DataFormat) -> DataFormat:
    """The record of the format ``name`` (a record is returned as it is).

    Raises:
        ValueError: No format of that name, listing the registered ones.
    """
    if isinstance(name, DataFormat):
        return name
    record = _REGISTRY.get(name)
    if record is None:
        raise ValueError(f"unknown data format {name!r}; expected one of {', '.join(_REGISTRY)}")
    return record


def formats_where(test: Callable[[DataFormat], bool]) -> tuple[str, ...]:
    """The names of the formats whose record passes ``test``, for error messages that list
    them (``formats_where(lambda f: f.noise_index)``)."""
    return tuple(name for name, record in _REGISTRY.items() if test(record))


def _owns(record: DataFormat, *, key: str) -> bool:
    return key in record.owns


def owned_key_problem(data: Any) -> tuple[str, str] | None:
    """The first ``[data]`` key set in ``data`` that only other formats read, as ``(key,
    message)``, or ``None``: every record's :attr:`DataFormat.owns`, in registration order."""
    own = get_format(data.format)
    for record in _REGISTRY.values():
        for key in record.owns:
            if key in own.owns or getattr(data, key) is None:
                continue
            readers = formats_where(partial(_owns, key=key))
            noun = "format" if len(readers) == 1 else "formats"
            return key, f"only read with {noun} {', '.join(repr(r) for r in readers)}"
    return None


def missing_key_problem(data: Any) -> tuple[str, str] | None:
    """The first key the configured format requires (:attr:`DataFormat.needs`) that ``data``
    leaves unset, as ``(key, message)``, or ``None``."""
    record = get_format(data.format)
    for key, why in record.needs.items():
        value = getattr(data, key)
        if value is None or value == "" or value == []:
            return key, f"required for format {record.name!r} {why}"
    return None


__all__ = [
    "CAPTION_COUNT_KEYS",
    "INPUTS",
    "DataFormat",
    "MissingDataKey",
    "OpenRequest",
    "StreamOptions",
    "format_names",
    "formats_where",
    "get_format",
    "missing_key_problem",
    "owned_key_problem",
    "register_format",
]
