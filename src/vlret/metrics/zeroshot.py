"""Zero-shot classification metrics: top-1 / top-5 accuracy and mean per-class recall, as
CLIP_benchmark reports them (``acc1``, ``acc5``, ``mean_per_class_recall``, fractions in
``[0, 1]``).

Definitions, for ``logits (N, C)`` (image ``i`` against class ``c``) and ``labels (N,)``:

* the **rank** of image ``i`` is the number of other classes whose logit is ``>=`` the logit of
  its true class (0-based; **ties count against the true class**, as the retrieval ranks of
  :mod:`vlret.metrics.ranks` do), so a collapsed model whose logits are all equal is never
  right, where a top-k by index order would call it right on class 0. ``ties="index"`` takes
  the other reading: a tie goes to the lower class index (a stable sort's order, ``argmax``'s
  choice and CLIP_benchmark's in practice);
* ``acc1`` and ``acc5`` are the fractions of images of rank ``< 1`` and ``< 5``; ``acc5`` is NaN
  with fewer than 5 classes (every image would be right);
* ``mean_per_class_recall`` is balanced accuracy: the top-1 accuracy of each class's images,
  averaged over the classes **present in** ``labels``. A class with no image is left out of the
  mean (neither a 0 nor a NaN), as scikit-learn's ``balanced_accuracy_score`` does in
  CLIP_benchmark; an image predicted as an absent class is simply wrong.

The ranks are counted from row blocks of the logits (no ``N x C`` sort: one comparison per
entry), so ImageNet's 50,000 x 1,000 logits need one block's worth of extra memory; ties against
the true class are the ranking core's count (:func:`~vlret.metrics.ranking.rank_blocks`, the
``class-label`` relevance), and the metrics its functions of the ranks.

This module is core: it imports torch, numpy and the ranking core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._checks import check_finite
from .ranking import accuracy_at_k, matrix_blocks, mean_per_class_recall, rank_blocks
from .relevance_kinds import ClassLabel

#: how a tie with the true class's logit is counted (see the module docstring)
TIE_RULES = ("against", "index")
#: logits per row block of the rank count
_BLOCK_ENTRIES = 1 << 22


def _check_logits(logits: Any) -> torch.Tensor:
    if isinstance(logits, np.ndarray):
        logits = torch.from_numpy(logits)
    if (
        not isinstance(logits, torch.Tensor)
        or logits.dim() != 2
        or not logits.dtype.is_floating_point
    ):
        got = (
            f"shape {tuple(logits.shape)} dtype {logits.dtype}"
            if isinstance(logits, torch.Tensor)
            else type(logits).__name__
        )
        raise ValueError(f"logits must be a 2-D floating-point (images, classes) tensor, got {got}")
    if 0 in logits.shape:
        raise ValueError(
            f"logits is empty (shape {tuple(logits.shape)}): zero-shot metrics need at least one "
            "image and one class"
        )
    check_finite(logits, "logits")
    return logits


def _check_labels(labels: Any, n_images: int, n_classes: int, device: torch.device) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        if isinstance(labels, str) or not isinstance(labels, Sequence | np.ndarray):
            raise ValueError(
                f"labels must be a 1-D integer tensor (the class of each image), got "
                f"{type(labels).__name__}"
            )
        labels = torch.as_tensor(np.asarray(labels))
    if labels.dim() != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(
            "labels must be a 1-D integer tensor (the class of each image), got shape "
            f"{tuple(labels.shape)} dtype {labels.dtype}"
        )
    if labels.numel() != n_images:
        raise ValueError(
            f"labels must have one entry per row of logits ({n_images}), got {labels.numel()}"
        )
    out = labels.to(device=device, dtype=torch.long)
    low, high = int(out.min()), int(out.max())
    if low < 0 or high >= n_classes:
        bad = low if low < 0 else high
        raise ValueError(f"labels must lie in [0, {n_classes}), the number of classes; got {bad}")
    return out


def true_class_ranks(logits: Any, labels: Any, *, ties: str = "against") -> torch.Tensor:
    """The 0-based rank of each image's true class among the classes, ``(N,)`` long.

    Args:
        logits: ``(N, C)`` scores of each image against each class (finite).
        labels: ``(N,)`` the true class of each image, in ``[0, C)``.
        ties: ``"against"`` (a class scoring equal to the true class ranks above it) or
            ``"index"`` (it ranks above it only when its index is lower).

    Returns:
        The ranks, on the device of ``logits``.

    Raises:
        ValueError: A malformed or non-finite ``logits``, ``labels`` of the wrong shape, type
            or range, or an unknown ``ties``.
    """
    if ties not in TIE_RULES:
        raise ValueError(f"ties must be one of {', '.join(TIE_RULES)}, got {ties!r}")
    logits = _check_logits(logits)
    n, c = logits.shape
    target = _check_labels(labels, n, c, logits.device)
    step = max(1, _BLOCK_ENTRIES // c)
    columns = torch.arange(c, device=logits.device)
    if ties == "against":  # the ranking core's count, the class-label relevance's ids
        query_ids, class_ids = ClassLabel().ids("i2c", {"labels": target, "n_classes": c})
        counted = rank_blocks(
            matrix_blocks(logits, rows=step),
            n_queries=n,
            query_ids=query_ids,
            gallery_ids=class_ids,
        )
        return counted.first.to(logits.device)
    ranks = torch.empty(n, dtype=torch.long, device=logits.device)
    for a in range(0, n, step):
        block, t = logits[a : a + step], target[a : a + step]
        true = block.gather(1, t[:, None])
        above = (block > true).sum(1)
        tied = ((block == true) & (columns[None, :] < t[:, None])).sum(1)
        ranks[a : a + step] = above + tied
    return ranks


def zeroshot_classification_metrics(
    logits: Any, labels: Any, *, ties: str = "against"
) -> dict[str, float]:
    """``{"acc1", "acc5", "mean_per_class_recall"}`` of zero-shot logits, as fractions.

    See the module docstring for the definitions (ties count against the true class unless
    ``ties="index"``; ``acc5`` is NaN below 5 classes; the per-class mean runs over the classes
    present in ``labels``).

    Args:
        logits: ``(N, C)`` scores of each image against each class (finite), a tensor or a
            numpy array.
        labels: ``(N,)`` the true class of each image, in ``[0, C)``.
        ties: ``"against"`` or ``"index"`` (:func:`true_class_ranks`).

    Returns:
        The three metrics, each a float in ``[0, 1]`` (``acc5`` NaN when ``C < 5``).

    Raises:
        ValueError: As :func:`true_class_ranks`.
    """
    ranks = true_class_ranks(logits, labels, ties=ties)
    n_classes = int(logits.shape[1])
    target = _check_labels(labels, ranks.numel(), n_classes, ranks.device)
    acc5 = accuracy_at_k(ranks, 5) if n_classes >= 5 else float("nan")
    recall = mean_per_class_recall(ranks, target, n_classes)
    return {"acc1": accuracy_at_k(ranks, 1), "acc5": acc5, "mean_per_class_recall": recall}


__all__ = ["TIE_RULES", "true_class_ranks", "zeroshot_classification_metrics"]
