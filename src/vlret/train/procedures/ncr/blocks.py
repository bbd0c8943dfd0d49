"""The score matrices of NCR's per-epoch loss pass, each image of a block scored once.

The pass (:meth:`vlret.train.procedures.ncr.NCRStep.loss_pass`) scores the training set in
blocks of consecutive pairs, and consecutive captions mostly describe the same image (five per
image in COCO and Flickr30K), so a block of ``B`` pairs holds about ``B / 5`` distinct images
(plus one for each re-paired caption). A pair-scoring model's ``(B, B)`` block matrix then has
equal rows: the row of pair ``i`` is image ``i`` scored against every caption of the block, and
it is the same for every pair of that image. :func:`block_scores` scores each distinct image
once, ``(U, B)``, and gives back the ``(B, B)`` matrix by repeating rows; every entry is the
score the whole-block forward computes for the same image and caption (equal to float rounding:
only the GEMMs' row counts differ), so the per-pair losses and the mixtures fitted to them are
those of the whole-block pass, for about ``U / B`` of the pair-scoring cost.

The saving comes from the pass's consecutive blocks: the release's ``eval_train`` draws its
blocks from a shuffled loader, whose pairs rarely share an image, and where that is so (a
shuffled or per-pair augmented training set) every block is scored whole, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from ....models.pair_scorer import PairScoringModel
from ....models.text import check_captions


def distinct_images(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)`` for a batch whose pairs share images: ``first`` the position of
    each distinct image's first pair (ordered by image index), ``inverse`` each pair's entry in
    ``first``, so ``features[first][inverse]`` equals ``features``.

    ``None`` (score the block whole) when every image is distinct, when fewer than two are (a
    scorer may need two), when ``features`` is not one tensor (expert or pixel batches, lists),
    or when two pairs of one image index carry different features (per-pair augmentation).
    """
    feats = batch.features
    if not isinstance(feats, torch.Tensor):
        return None
    index = batch.img_index.to(feats.device)
    images, inverse = torch.unique(index, return_inverse=True)
    if len(images) == len(index) or len(images) < 2:
        return None
    positions = torch.arange(len(index), device=index.device)
    first = torch.full_like(images, len(index)).scatter_reduce_(0, inverse, positions, "amin")
    if not torch.equal(feats[first][inverse], feats):
        return None
    return first, inverse


def block_scores(
    net: nn.Module,
    batch: Any,
    *,
    distinct: tuple[torch.Tensor, torch.Tensor] | None,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> torch.Tensor | None:
    """The ``(B, B)`` score matrix of a pair-scoring ``net`` (a
    :class:`~vlret.models.pair_scorer.PairScoringModel` with its own ``forward``) on ``batch``,
    each distinct image (``distinct``, from :func:`distinct_images`) encoded and scored once;
    ``None`` when that does not apply (no shared images, or another kind of model), for the
    caller to run the whole-block forward.

    Args:
        net: The network.
        batch: A :class:`~vlret.data.RetrievalBatch` on the network's device.
        distinct: ``(first, inverse)`` of the batch, or None.
        autocast: The trainer's mixed-precision context (``TrainContext.autocast``).

    Returns:
        The scores (rows: the pairs' images, columns: their captions), or None.
    """
    if distinct is None or not isinstance(net, PairScoringModel):
        return None
    if type(net).forward is not PairScoringModel.forward:
        return None
    first, inverse = distinct
    with autocast():
        images = net.encode_images(batch.features[first])
        captions, lengths = check_captions(batch.captions, batch.lengths)
        texts = net.encode_texts(captions, lengths)
        rows = net.token_lengths(lengths).to(texts.device)
        scores = net.score(images, texts, rows)
    return scores[inverse.to(scores.device)]


__all__ = ["block_scores", "distinct_images"]
