"""What counts as relevant to a query: one object per relevance kind, and their registry.

An evaluation protocol names its relevance kind by a string (``image-of-caption``,
``any-caption-of-video``, ``same-identity``, ``class-label``: the names config files and the
command line use). This module turns the name into an object that says everything the ranking
core and the harness ask of it, so that no code outside this module compares the names.

Public names (stable):

* :class:`Relevance`: the base class. Each kind is a frozen subclass with

  - :attr:`~Relevance.name`: its registry name (``image-of-caption`` ...);
  - :attr:`~Relevance.directions`: the directions it ranks, e.g. ``("i2t", "t2i")``; the first
    letter names the queries and the last the gallery (``i2c``: images ranking classes);
  - :attr:`~Relevance.needs`: the labels :meth:`~Relevance.ids` reads (keys of its ``labels``
    mapping: ``txt_to_img``, ``image_ids`` / ``caption_ids``, ``labels`` / ``n_classes``);
  - :meth:`~Relevance.ids`: for one direction, the ``(query_ids, gallery_ids)`` such that
    gallery item ``g`` is relevant to query ``q`` exactly when ``query_ids[q] ==
    gallery_ids[g]`` (the ranking core, :mod:`vlret.metrics.ranking`, takes these);
  - capabilities the harness asks instead of comparing names: :attr:`~Relevance.captions`
    (ranked from the captions' images, ``txt_to_img``, by the retrieval pipeline, with its
    recall / rsum metrics), :attr:`~Relevance.identities` (needs the person identity of every
    image and caption), :attr:`~Relevance.classes` (zero-shot classification: images ranking
    class prompts), :attr:`~Relevance.clip_benchmark` (written in CLIP_benchmark's
    ``zeroshot_retrieval`` JSON record), :attr:`~Relevance.rescoring` (dual softmax / QB-Norm
    apply), :attr:`~Relevance.shortlists` (the approximate shortlist protocol applies),
    :attr:`~Relevance.visual` (the table's word for the visual side: ``image`` or ``video``)
    and :attr:`~Relevance.metrics` (the metric keys a protocol of this kind may report).

* :class:`ImageOfCaption`, :class:`AnyCaptionOfVideo`, :class:`SameIdentity`,
  :class:`ClassLabel`: the four kinds.
* :func:`get_relevance` (a name or an object -> the registered object; an unknown name is a
  one-line ``ValueError`` listing the known ones), :func:`relevance_names` (the registered
  names, in registration order) and :func:`register_relevance` (add a kind: see
  ``docs/adding-a-relevance-kind.md``).

The score matrices of :mod:`vlret.metrics` put the visual side in rows: ``(N_img, N_txt)``. So a
kind's ids are given for its rows and columns (:meth:`~Relevance.row_column_ids`), and a
direction whose queries are the columns (``t2i``) swaps them.

This module is core: it imports torch, numpy and :mod:`vlret.metrics.keys`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .keys import IDENTITY_METRIC_KEYS, RETRIEVAL_METRIC_KEYS, ZEROSHOT_METRICS


def _label_ids(labels: Mapping[str, Any], key: str, kind: str) -> torch.Tensor:
    """``labels[key]`` as a 1-D long tensor, or a one-line error naming the key."""
    if key not in labels or labels[key] is None:
        raise ValueError(f"relevance {kind}: needs the label {key!r} (got {sorted(labels)})")
    x = labels[key]
    if not isinstance(x, torch.Tensor):
        if isinstance(x, str) or not isinstance(x, Sequence | np.ndarray):
            raise ValueError(f"{key} must be a 1-D integer tensor, got {type(x).__name__}")
        x = torch.as_tensor(np.asarray(x))
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(
            f"{key} must be a 1-D integer tensor, got shape {tuple(x.shape)} dtype {x.dtype}"
        )
    return x.to(torch.long)


def _label_count(labels: Mapping[str, Any], key: str, kind: str) -> int:
    if key not in labels or labels[key] is None:
        raise ValueError(f"relevance {kind}: needs the label {key!r} (got {sorted(labels)})")
    n = labels[key]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{key} must be a positive integer, got {n!r}")
    return n


@dataclass(frozen=True)
class Relevance:
    """A relevance kind (see the module docstring). Subclasses set the class attributes and
    implement :meth:`row_column_ids`."""

    #: the registry name (a protocol's ``relevance``)
    name: ClassVar[str] = ""
    #: the directions it ranks: ``"<queries>2<gallery>"``; ``i`` = the rows of the score
    #: matrix (images, videos), ``t`` = its columns (captions), ``c`` = classes (columns)
    directions: ClassVar[tuple[str, ...]] = ()
    #: the labels :meth:`ids` reads
    needs: ClassVar[tuple[str, ...]] = ()
    #: ranked by the retrieval pipeline from each caption's image (``txt_to_img``)
    captions: ClassVar[bool] = False
    #: needs the person identity of every image and caption
    identities: ClassVar[bool] = False
    #: zero-shot classification: images ranking the classes
    classes: ClassVar[bool] = False
    #: written in CLIP_benchmark's ``zeroshot_retrieval`` JSON record
    clip_benchmark: ClassVar[bool] = False
    #: the NON-STANDARD re-scorings (dual softmax, QB-Norm) apply
    rescoring: ClassVar[bool] = False
    #: the approximate shortlist protocol applies
    shortlists: ClassVar[bool] = False
    #: the table's word for the visual side
    visual: ClassVar[str] = "image"

    #: the metric keys a protocol of this kind may report
    metrics: ClassVar[tuple[str, ...]] = RETRIEVAL_METRIC_KEYS

    def row_column_ids(self, labels: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row_ids, column_ids)`` of the ``(rows, columns)`` score matrix: column ``c`` is
        relevant to row ``r`` exactly when ``row_ids[r] == column_ids[c]``."""
        raise NotImplementedError

    def ids(self, direction: str, labels: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(query_ids, gallery_ids)`` of ``direction`` (one of :attr:`directions`): gallery
        item ``g`` is relevant to query ``q`` exactly when ``query_ids[q] == gallery_ids[g]``.

        Args:
            direction: The direction ranked (``i2t``: rows query, ``t2i``: columns query).
            labels: The labels named by :attr:`needs`.

        Returns:
            Two 1-D long tensors: one id per query, one per gallery item.

        Raises:
            ValueError: A direction this kind does not rank, or a missing or malformed label.
        """
        if direction not in self.directions:
            raise ValueError(
                f"relevance {self.name}: direction must be one of {', '.join(self.directions)}, "
                f"got {direction!r}"
            )
        rows, columns = self.row_column_ids(labels)
        return (rows, columns) if direction[0] == "i" else (columns, rows)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ImageOfCaption(Relevance):
    """A caption's own image is its one relevant item; an image's relevant items are its
    captions (COCO, Flickr30K). Labels: ``txt_to_img`` (the image of each caption) and, when
    the last images may have no caption, ``n_images``."""

    name: ClassVar[str] = "image-of-caption"
    directions: ClassVar[tuple[str, ...]] = ("i2t", "t2i")
    needs: ClassVar[tuple[str, ...]] = ("txt_to_img",)
    captions: ClassVar[bool] = True
    clip_benchmark: ClassVar[bool] = True
    rescoring: ClassVar[bool] = True
    shortlists: ClassVar[bool] = True

    def row_column_ids(self, labels: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        t2i = _label_ids(labels, "txt_to_img", self.name)
        if "n_images" in labels and labels["n_images"] is not None:
            n_img = _label_count(labels, "n_images", self.name)
        else:
            n_img = int(t2i.max()) + 1 if t2i.numel() else 0
        return torch.arange(n_img, device=t2i.device), t2i


@dataclass(frozen=True)
class AnyCaptionOfVideo(ImageOfCaption):
    """Every caption of a video is relevant to it (MSR-VTT): the same ranks as
    :class:`ImageOfCaption` (a video's rank is its best caption's), a video on the visual
    side."""

    name: ClassVar[str] = "any-caption-of-video"
    visual: ClassVar[str] = "video"


@dataclass(frozen=True)
class SameIdentity(Relevance):
    """Every gallery item of the query's person is relevant (text-based person search).
    Labels: ``image_ids`` and ``caption_ids``, the person of each image and caption."""

    name: ClassVar[str] = "same-identity"
    directions: ClassVar[tuple[str, ...]] = ("t2i", "i2t")
    needs: ClassVar[tuple[str, ...]] = ("image_ids", "caption_ids")
    identities: ClassVar[bool] = True

    metrics: ClassVar[tuple[str, ...]] = IDENTITY_METRIC_KEYS

    def row_column_ids(self, labels: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        images = _label_ids(labels, "image_ids", self.name)
        captions = _label_ids(labels, "caption_ids", self.name)
        return images, captions


@dataclass(frozen=True)
class ClassLabel(Relevance):
    """An image's one relevant item is its class (zero-shot classification: rows are images,
    columns the classes' prompts). Labels: ``labels`` (the class of each image) and
    ``n_classes``."""

    name: ClassVar[str] = "class-label"
    directions: ClassVar[tuple[str, ...]] = ("i2c",)
    needs: ClassVar[tuple[str, ...]] = ("labels", "n_classes")
    classes: ClassVar[bool] = True

    metrics: ClassVar[tuple[str, ...]] = ZEROSHOT_METRICS

    def row_column_ids(self, labels: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        target = _label_ids(labels, "labels", self.name)
        n_classes = _label_count(labels, "n_classes", self.name)
        return target, torch.arange(n_classes, device=target.device)


_REGISTRY: dict[str, Relevance] = {}


def register_relevance(kind: Relevance) -> Relevance:
    """Add ``kind`` to the registry (a second kind of the same name is an error)."""
    if not isinstance(kind, Relevance) or not kind.name:
        raise ValueError(f"kind: expected a named Relevance instance, got {kind!r}")
    if kind.name in _REGISTRY:
        raise ValueError(f"relevance {kind.name!r} is registered twice")
    if not kind.directions:
        raise ValueError(f"relevance {kind.name}: directions must not be empty")
    _REGISTRY[kind.name] = kind
    return kind


def relevance_names() -> tuple[str, ...]:
    """The registered relevance kinds' names, in registration order."""
    return tuple(_REGISTRY)


def get_relevance(kind: str | Relevance) -> Relevance:
    """The registered relevance kind named ``kind`` (an object is returned as is)."""
    if isinstance(kind, Relevance):
        return kind
    if not isinstance(kind, str) or kind not in _REGISTRY:
        raise ValueError(f"relevance must be one of {', '.join(_REGISTRY)}, got {kind!r}")
    return _REGISTRY[kind]


for _kind in (ImageOfCaption(), AnyCaptionOfVideo(), SameIdentity(), ClassLabel()):
    register_relevance(_kind)


__all__ = [
    "AnyCaptionOfVideo",
    "ClassLabel",
    "ImageOfCaption",
    "Relevance",
    "SameIdentity",
    "get_relevance",
    "register_relevance",
    "relevance_names",
]
